"""NUTS (blackjax) over the unconstrained GP hyperparameters; log density from eqxprob.

The sampler moves the unconstrained parameters `u` (the `param` of each
`ep.Bijector`), so the target is the log posterior density of `u`, Jacobian included:
`-nlml + ep.log_prior(resolved) + ep.log_det_jacobian(params)`.
Runs several chains from jittered starts (`jax.vmap`) and prints posterior
summaries with the R-hat and effective sample size of blackjax's diagnostics;
writes `nuts_blackjax.png` (traces per chain and marginals).

Needs the `examples` extra (`pip install -e ".[examples]"`, which brings blackjax).
Run: `python examples/nuts_blackjax.py [--warmup N] [--samples N] [--n N] [--chains N]`
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
    chains: int = 4,
):
    with jax.enable_x64(True):
        x, y = make_data(n)
        params = ep.parameterize(initial_model())
        position, static = ep.partition(params)

        def log_density(position):
            params = eqx.combine(position, static)
            gp = ep.resolve(params)
            return -gp.nlml(x, y) + ep.log_prior(gp) + ep.log_det_jacobian(params)

        def chain(key):
            """Warm-up, then `samples` draws, from a jittered start."""
            start_key, warmup_key, sample_key = jax.random.split(key, 3)
            start = jax.tree_util.tree_map(
                lambda p: p + 0.5 * jax.random.normal(start_key, p.shape, p.dtype),
                position,
            )
            adaptation = blackjax.window_adaptation(blackjax.nuts, log_density)
            (state, tuned), _ = adaptation.run(warmup_key, start, num_steps=warmup)
            kernel = blackjax.nuts(log_density, **tuned).step

            def one_step(state, key):
                state, info = kernel(key, state)
                gp = ep.resolve(eqx.combine(state.position, static))
                return state, (_hyperparameters(gp), info.is_divergent)

            keys = jax.random.split(sample_key, samples)
            return jax.lax.scan(one_step, state, keys)[1]

        keys = jax.random.split(jax.random.PRNGKey(seed), chains)
        draws, divergent = jax.jit(jax.vmap(chain))(keys)
        draws = np.asarray(draws)  # (chains, samples, hyperparameters)
        rhat = blackjax.diagnostics.potential_scale_reduction(
            draws, chain_axis=0, sample_axis=1
        )
        ess = blackjax.diagnostics.effective_sample_size(
            draws, chain_axis=0, sample_axis=1
        )
        pooled = draws.reshape(-1, draws.shape[-1])

        print(
            f"NUTS on GP hyperparameters: n = {n}, {chains} chains of {warmup} "
            f"warm-up + {samples} draws"
        )
        print(
            f"{'hyperparameter':<20}{'mean':>9}{'sd':>9}{'5%':>9}{'95%':>9}"
            f"{'R-hat':>8}{'ESS':>8}"
        )
        for i, name in enumerate(NAMES):
            q5, q95 = np.quantile(pooled[:, i], [0.05, 0.95])
            print(
                f"{name:<20}{pooled[:, i].mean():>9.4f}{pooled[:, i].std():>9.4f}"
                f"{q5:>9.4f}{q95:>9.4f}{float(rhat[i]):>8.3f}{float(ess[i]):>8.0f}"
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
        for c in range(draws.shape[0]):  # one colour per chain
            axes[i, 0].plot(draws[c, :, i], linewidth=0.5, alpha=0.8)
        axes[i, 0].set_ylabel(name)
        axes[i, 1].hist(draws[..., i].ravel(), bins=30, density=True, color="C1")
    axes[0, 0].set_title("trace (one colour per chain)")
    axes[0, 1].set_title("marginal (all chains)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--out", default="nuts_blackjax.png")
    parser.add_argument("--chains", type=int, default=4)
    args = parser.parse_args()
    main(args.warmup, args.samples, args.n, args.out, chains=args.chains)
