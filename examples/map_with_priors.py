"""MAP estimation of GP hyperparameters with priors, compared with the MLE.

The priors are declared next to the parameters with `ep.field(prior=...)` (see
`gp_regression.py`). Optimisation runs over the unconstrained parameters `u`, so the
objective is the log posterior density *of u*:

    log p(u | y) = log p(y | θ(u)) + log p(θ(u)) + log |det ∂θ/∂u| + const

which is `-nlml + ep.log_prior(resolved) + ep.log_det_jacobian(params)`.

Run: `python examples/map_with_priors.py [--steps N] [--n N]`
"""

from __future__ import annotations

import argparse

import jax
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


def main(
    steps: int = 500, n: int = 30, progress: bool = True
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
    return mle, map_


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    main(steps=args.steps, n=args.n)
