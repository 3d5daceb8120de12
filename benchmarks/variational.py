"""What `ep.guide` + `ep.elbo` cost: one ELBO training step against a hand-written
JAX step and numpyro's `SVI.update`, on Bayesian logistic regression.

All three compute the same estimator (mean-field Gaussian guide, one reparameterised
sample, the likelihood by Monte Carlo, the Gaussian prior and the entropy in closed
form for eqxprob and the hand-written step; numpyro's `Trace_ELBO` samples the prior
term too) and take one adam step. Prints compiled HLO instruction counts of one step
and the median time per step of a compiled `lax.scan` of steps over interleaved
rounds, as ratios against the hand-written step measured in the same run. Asserts
nothing.

Run: `OPENBLAS_NUM_THREADS=1 python benchmarks/variational.py [--rounds 7]`
"""

from __future__ import annotations

import argparse
import time

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import count_hlo_ops, table

import eqxprob as ep


N, D = 500, 5
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(N, D)), jnp.float32)
Y = jnp.asarray(X @ RNG.normal(size=D) + RNG.normal(size=N) > 0, jnp.float32)
OPTIMISER = optax.adam(0.01)


class Logistic(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))


def loglik(m):
    return jnp.sum(distrax.Bernoulli(logits=X @ m.w).log_prob(Y))


def _adam_step(loss):
    """One jitted adam step on `loss(params, key)`."""

    def step(p, state, key):
        value, grads = jax.value_and_grad(loss)(p, key)
        updates, state = OPTIMISER.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    return jax.jit(step)


def eqxprob_step():
    guide = ep.guide(Logistic(jnp.zeros(D)))
    params, static = eqx.partition(guide, ep.trainable(guide))

    def loss(p, key):
        return -ep.elbo(eqx.combine(p, static), loglik, key)

    return _adam_step(loss), (params, OPTIMISER.init(params))


def hand_step():
    params = {"loc": jnp.zeros(D), "raw": jnp.full(D, float(np.log(np.expm1(0.1))))}

    def loss(p, key):
        scale = jax.nn.softplus(p["raw"])
        w = p["loc"] + scale * jax.random.normal(key, (D,))
        ll = loglik(Logistic(w))  # the same likelihood code as the others
        prior = jnp.sum(-0.5 * jnp.log(2 * jnp.pi) - 0.5 * (p["loc"] ** 2 + scale**2))
        entropy = jnp.sum(0.5 * jnp.log(2 * jnp.pi * jnp.e) + jnp.log(scale))
        return -(ll + prior + entropy)

    return _adam_step(loss), (params, OPTIMISER.init(params))


def numpyro_step():
    import numpyro
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    def model():
        w = numpyro.sample(
            "w", numpyro.distributions.Normal(jnp.zeros(D), 1.0).to_event(1)
        )
        numpyro.sample("y", numpyro.distributions.Bernoulli(logits=X @ w), obs=Y)

    svi = SVI(model, AutoNormal(model, init_scale=0.1), OPTIMISER, Trace_ELBO())
    state = svi.init(jax.random.key(0))

    def step(state, _unused, key):  # the key lives in numpyro's state
        state, value = svi.update(state)
        return state, None, value

    return step, (state, None)


def main(rounds: int = 7, steps: int = 200) -> None:
    variants = {"hand-written JAX": hand_step(), "eqxprob guide + elbo": eqxprob_step()}
    try:
        variants["numpyro SVI (AutoNormal, Trace_ELBO)"] = numpyro_step()
    except ImportError:
        print("numpyro not installed: its row is skipped")
    key = jax.random.key(1)
    hlo = {}
    for name, (step, (a, b)) in variants.items():
        if name.startswith("numpyro"):
            hlo[name] = "-"
            continue
        hlo[name] = count_hlo_ops(jax.jit(step).lower(a, b, key).compile().as_text())

    def scanned(step):  # `steps` steps in one compiled loop: no dispatch cost
        def run(a, b, key):
            def body(carry, i):
                a, b = carry
                a, b, value = step(a, b, jax.random.fold_in(key, i))
                return (a, b), value

            return jax.lax.scan(body, (a, b), jnp.arange(steps))

        return jax.jit(run)

    compiled = {name: scanned(step) for name, (step, _) in variants.items()}

    def run(name):
        a, b = variants[name][1]
        start = time.perf_counter()
        jax.block_until_ready(compiled[name](a, b, key))
        return (time.perf_counter() - start) / steps

    names = list(variants)
    for name in names:  # warm up: compile
        run(name)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(run(name))
    base = float(np.median(times["hand-written JAX"]))
    rows = [
        [
            name,
            hlo[name],
            f"{np.median(times[name]) * 1e6:.1f}",
            f"{np.median(times[name]) / base:.2f}",
            f"{min(times[name]) / min(times['hand-written JAX']):.2f}",
        ]
        for name in names
    ]
    print(
        f"ELBO step, Bayesian logistic regression, n = {N}, d = {D}, adam, "
        f"{rounds} interleaved rounds of {steps} steps (OPENBLAS_NUM_THREADS as set)"
    )
    print(table(["variant", "HLO ops", "µs/step", "vs hand", "min vs hand"], rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    main(args.rounds, args.steps)
