"""NUTS (blackjax) over the unconstrained GP hyperparameters; log density from eqxprob.

The sampler moves the unconstrained parameters `u` (the `param` of each
`ep.Bijector`), so the target is the log posterior density of `u`, Jacobian included:
`-nlml + ep.log_prior(resolved) + ep.log_det_jacobian(params)`.
Prints posterior summaries and writes `nuts_blackjax.png` (traces and marginals).

Needs the `examples` extra (`pip install -e ".[examples]"`, which brings blackjax).
Run: `python examples/nuts_blackjax.py [--warmup N] [--samples N] [--n N]`
"""

from __future__ import annotations

import argparse

import blackjax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from gp_regression import HYPERPARAMETERS, initial_model, make_data

import eqxprob as ep


NAMES = tuple(HYPERPARAMETERS)


def _hyperparameters(gp) -> jax.Array:
    return jnp.stack([get(gp) for get in HYPERPARAMETERS.values()])


def main(
    warmup: int = 300,
    samples: int = 500,
    n: int = 30,
    out: str = "nuts_blackjax.png",
    seed: int = 0,
):
    with jax.enable_x64(True):
        x, y = make_data(n)
        params = ep.parameterize(initial_model())
        position, static = eqx.partition(params, ep.trainable(params))

        def log_density(position):
            params = eqx.combine(position, static)
            gp = ep.resolve(params)
            return -gp.nlml(x, y) + ep.log_prior(gp) + ep.log_det_jacobian(params)

        warmup_key, sample_key = jax.random.split(jax.random.PRNGKey(seed))
        adaptation = blackjax.window_adaptation(blackjax.nuts, log_density)
        (state, tuned), _ = adaptation.run(warmup_key, position, num_steps=warmup)
        kernel = blackjax.nuts(log_density, **tuned).step

        def one_step(state, key):
            state, info = kernel(key, state)
            gp = ep.resolve(eqx.combine(state.position, static))
            return state, (_hyperparameters(gp), info.is_divergent)

        keys = jax.random.split(sample_key, samples)
        _, (draws, divergent) = jax.jit(lambda s, k: jax.lax.scan(one_step, s, k))(
            state, keys
        )
        draws = np.asarray(draws)

        print(f"NUTS on GP hyperparameters: n = {n}, {warmup} warm-up, {samples} draws")
        print(f"{'hyperparameter':<20}{'mean':>9}{'sd':>9}{'5%':>9}{'95%':>9}")
        for i, name in enumerate(NAMES):
            q5, q95 = np.quantile(draws[:, i], [0.05, 0.95])
            print(
                f"{name:<20}{draws[:, i].mean():>9.4f}{draws[:, i].std():>9.4f}"
                f"{q5:>9.4f}{q95:>9.4f}"
            )
        print(f"divergent transitions: {int(np.sum(divergent))}")
        _plot(draws, out)
        print(f"wrote {out}")
    return draws


def _plot(draws: np.ndarray, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(NAMES), 2, figsize=(9, 6))
    for i, name in enumerate(NAMES):
        axes[i, 0].plot(draws[:, i], linewidth=0.6)
        axes[i, 0].set_ylabel(name)
        axes[i, 1].hist(draws[:, i], bins=30, density=True, color="C1")
    axes[0, 0].set_title("trace")
    axes[0, 1].set_title("marginal")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--out", default="nuts_blackjax.png")
    args = parser.parse_args()
    main(args.warmup, args.samples, args.n, args.out)
