"""Exact-GP training: eqxprob variants against hand-written JAX, in one run.

RBF + noise, softplus constraints, float64, adam(0.01), x = linspace(0, 10, n),
y = sin(x) + 0.1·noise, initial lengthscale 1, variance 1, noise 0.5. Variants:

- hand-written JAX: a dict of unconstrained arrays and a Cholesky NLML, as a jitted
  Python loop and as one `lax.scan`;
- eqxprob `Bijector` + `resolve` (the model from examples/gp_regression.py, built
  with `ep.parameterize`), jitted Python loop;
- eqxprob registry `unconstrain`/`constrain`, jitted Python loop;
- `ep.fit` (chunks of `lax.scan`);
- GPJax and paramax when importable (not installed here: noted and skipped).

Prints per variant: compile time, median time per step, ratio to the fastest
hand-written loop, compiled HLO instruction count of one step, and the final NLML
and hyperparameters (which must agree to 1e-6 relative).

Run: `python benchmarks/gp_training.py [--quick] [--steps N]`
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import hlo_op_count, table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from gp_regression import initial_model, make_data  # noqa: E402

import eqxprob as ep  # noqa: E402


OPTIMISER = optax.adam(0.01)


def _inv_softplus(v: float) -> jax.Array:
    return jnp.log(jnp.expm1(jnp.asarray(v, jnp.float64)))


def _hand_nlml(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    ls, var, noise = (jax.nn.softplus(p[k]) for k in ("ls", "var", "noise"))
    k = var * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2)
    lower = jnp.linalg.cholesky(k + noise * jnp.eye(x.shape[0], dtype=x.dtype))
    alpha = jax.scipy.linalg.solve_triangular(lower, y, lower=True)
    n = x.shape[0]
    return (
        0.5 * alpha @ alpha
        + jnp.sum(jnp.log(jnp.diag(lower)))
        + 0.5 * n * jnp.log(2 * jnp.pi)
    )


def _hand_params() -> dict:
    return {
        "ls": _inv_softplus(1.0),
        "var": _inv_softplus(1.0),
        "noise": _inv_softplus(0.5),
    }


def _loop_variant(params, loss, steps: int, filter_jit: bool):
    """A jitted step called from a Python loop: (compile s, per-step s, result, ops)."""
    state = OPTIMISER.init(eqx.filter(params, eqx.is_inexact_array))

    def step(params, state):
        value, grads = eqx.filter_value_and_grad(loss)(params)
        updates, state = OPTIMISER.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, value

    jitted = eqx.filter_jit(step) if filter_jit else jax.jit(step)
    start = time.perf_counter()
    params, state, value = jax.block_until_ready(jitted(params, state))
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps - 1):
        params, state, value = jitted(params, state)
    jax.block_until_ready(value)
    per_step = (time.perf_counter() - start) / (steps - 1)
    dynamic, static = eqx.partition((params, state), eqx.is_array)
    ops = hlo_op_count(lambda d: step(*eqx.combine(d, static)), dynamic)
    return compile_s, per_step, params, ops


def _scan_variant(params, loss, steps: int):
    state = OPTIMISER.init(params)

    def step(carry, _):
        params, state = carry
        grads = jax.grad(loss)(params)
        updates, state = OPTIMISER.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), None

    run = jax.jit(lambda p, s: jax.lax.scan(step, (p, s), None, length=steps)[0])
    start = time.perf_counter()
    compiled = run.lower(params, state).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    params, state = jax.block_until_ready(compiled(params, state))
    per_step = (time.perf_counter() - start) / steps
    return compile_s, per_step, params, None


def _fit_variant(model, loss, steps: int):
    start = time.perf_counter()
    ep.fit(model, loss, optimiser=OPTIMISER, steps=min(100, steps), progress=False)
    compile_s = time.perf_counter() - start  # includes 100 steps; compile dominates
    start = time.perf_counter()
    trained, _ = ep.fit(model, loss, optimiser=OPTIMISER, steps=steps, progress=False)
    jax.block_until_ready(trained)
    per_step = (time.perf_counter() - start) / steps
    return compile_s, per_step, trained, None


def _summary(nlml: float, ls: float, var: float, noise: float) -> np.ndarray:
    return np.array([nlml, ls, var, noise])


def run(n: int, steps: int) -> list[list]:
    x, y = make_data(n)
    results = {}

    hand = _hand_params()
    loss = lambda p: _hand_nlml(p, x, y)  # noqa: E731
    for name, variant in [
        ("hand-written, jitted loop", lambda: _loop_variant(hand, loss, steps, False)),
        ("hand-written, lax.scan", lambda: _scan_variant(hand, loss, steps)),
    ]:
        compile_s, per_step, p, ops = variant()
        soft = {k: float(jax.nn.softplus(v)) for k, v in p.items()}
        results[name] = (
            compile_s,
            per_step,
            ops,
            _summary(float(loss(p)), soft["ls"], soft["var"], soft["noise"]),
        )

    bijector_model = ep.parameterize(initial_model())
    resolve_loss = lambda m: ep.resolve(m).nlml(x, y)  # noqa: E731
    raw_model = ep.unconstrain(initial_model())
    constrain_loss = lambda m: ep.constrain(m).nlml(x, y)  # noqa: E731
    for name, variant, to_gp in [
        (
            "eqxprob Bijector + resolve",
            lambda: _loop_variant(bijector_model, resolve_loss, steps, True),
            ep.resolve,
        ),
        (
            "eqxprob registry constrain",
            lambda: _loop_variant(raw_model, constrain_loss, steps, True),
            ep.constrain,
        ),
        (
            "eqxprob ep.fit",
            lambda: _fit_variant(bijector_model, resolve_loss, steps),
            ep.resolve,
        ),
    ]:
        compile_s, per_step, m, ops = variant()
        gp = to_gp(m)
        results[name] = (
            compile_s,
            per_step,
            ops,
            _summary(
                float(gp.nlml(x, y)),
                float(gp.kernel.lengthscale),
                float(gp.kernel.variance),
                float(gp.noise),
            ),
        )

    baseline = min(
        results["hand-written, jitted loop"][1], results["hand-written, lax.scan"][1]
    )
    reference = results["hand-written, jitted loop"][3]
    rows = []
    for name, (compile_s, per_step, ops, summary) in results.items():
        agree = np.allclose(summary, reference, rtol=1e-6, atol=0)
        rows.append(
            [
                n,
                name,
                f"{compile_s:.2f}",
                f"{per_step * 1e3:.3f}",
                f"{per_step / baseline:.2f}",
                "-" if ops is None else ops,
                f"{summary[0]:.6f}",
                " ".join(f"{v:.5f}" for v in summary[1:]),
                "yes" if agree else "NO",
            ]
        )
    for library in ("gpjax", "paramax"):
        if importlib.util.find_spec(library) is None:
            rows.append([n, f"{library}: not installed, skipped"] + [""] * 7)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 200 only")
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    sizes = [200] if args.quick else [200, 1000, 3000]
    rows = []
    for n in sizes:
        rows += run(n, args.steps)
    header = [
        "n",
        "variant",
        "compile s",
        "ms/step",
        "vs hand",
        "HLO ops/step",
        "final NLML",
        "lengthscale variance noise",
        "agree 1e-6",
    ]
    print(f"Exact GP training, {args.steps} steps of adam(0.01), float64")
    print(table(header, rows))
    print("ep.fit 'compile s' includes its first 100 steps.")


if __name__ == "__main__":
    main()
