"""MAP estimation of GP hyperparameters with priors, compared with the MLE.

The priors are declared next to the parameters with `ep.field(prior=...)` (see
`gp_regression.py`). Optimisation runs over the unconstrained parameters `u`, so the
objective is the log posterior density *of u*:

    log p(u | y) = log p(y | θ(u)) + log p(θ(u)) + log |det ∂θ/∂u| + const

which is `-nlml + ep.log_prior(resolved) + ep.log_det_jacobian(params)`.

Writes `map_with_priors.png`: for each hyperparameter, its prior (read from the
field's metadata with `ep.prior_tree`) against its profile posterior, with the MLE
and the MAP marked.

Run: `python examples/map_with_priors.py [--steps N] [--n N] [--out FILE]`
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from gp_regression import HYPERPARAMETERS, ExactGP, initial_model, make_data, train

import eqxprob as ep


def train_map(x, y, steps: int = 500, progress: bool = True) -> ExactGP:
    def negative_log_posterior(params):
        gp = ep.resolve(params)
        log_posterior = -gp.nlml(x, y) + ep.log_prior(gp) + ep.log_det_jacobian(params)
        return -log_posterior

    params, _ = ep.fit(
        ep.parameterize(initial_model()),
        negative_log_posterior,
        optimiser=optax.adam(0.01),
        steps=steps,
        progress=progress,
    )
    return ep.resolve(params)


def profile(gp: ExactGP, x, y, get, grid) -> tuple[np.ndarray, np.ndarray]:
    """Prior density and (numerically normalised) profile posterior density of one
    hyperparameter on `grid`, the others held at `gp`'s values."""
    prior = get(ep.prior_tree(gp))  # the field's own prior, from its metadata

    def log_posterior(value):
        other = eqx.tree_at(get, gp, value)
        return -other.nlml(x, y) + ep.log_prior(other)

    grid = jnp.asarray(grid)
    log_post = jax.vmap(log_posterior)(grid)
    post = np.exp(np.asarray(log_post - jnp.max(log_post)))
    post /= np.trapezoid(post, np.asarray(grid))
    return np.exp(np.asarray(prior.log_prob(grid))), post


def plot(mle: ExactGP, map_: ExactGP, x, y, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(HYPERPARAMETERS), figsize=(11, 3.2))
    for ax, (name, get) in zip(axes, HYPERPARAMETERS.items()):
        top = 3 * max(float(get(mle)), float(get(map_)), 0.2)
        grid = np.linspace(top / 400, top, 400)
        prior, posterior = profile(map_, x, y, get, grid)
        ax.plot(grid, prior, "--", color="0.5", label="prior")
        ax.plot(grid, posterior, color="C0", label="posterior (profile)")
        ax.axvline(float(get(mle)), color="C1", linewidth=1, label="MLE")
        ax.axvline(float(get(map_)), color="C2", linewidth=1, label="MAP")
        ax.set(title=name, yticks=[])
    axes[0].legend(loc="upper right", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    steps: int = 500, n: int = 30, progress: bool = True, out: str | None = None
) -> tuple[ExactGP, ExactGP]:
    with jax.enable_x64(True):
        x, y = make_data(n)
        mle, _ = train(x, y, steps=steps, progress=progress)
        map_ = train_map(x, y, steps=steps, progress=progress)
        print(f"GP hyperparameters on n = {n} points: maximum likelihood vs MAP")
        print("priors: lengthscale, variance ~ Gamma(2, 1); noise ~ Gamma(1, 10)")
        print(f"{'hyperparameter':<22}{'MLE':>10}{'MAP':>10}")
        for name, get in HYPERPARAMETERS.items():
            print(f"{name:<22}{float(get(mle)):>10.4f}{float(get(map_)):>10.4f}")
        print(
            f"{'NLML':<22}{float(mle.nlml(x, y)):>10.4f}{float(map_.nlml(x, y)):>10.4f}"
        )
        print(f"{'log prior':<22}{float(ep.log_prior(mle)):>10.4f}", end="")
        print(f"{float(ep.log_prior(map_)):>10.4f}")
        if out is not None:
            plot(mle, map_, x, y, out)
            print(f"wrote {out}")
    return mle, map_


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--out", default="map_with_priors.png")
    args = parser.parse_args()
    main(steps=args.steps, n=args.n, out=args.out)
