"""Exact-GP training: eqxprob against hand-written JAX, paramax and GPJax, in one run.

RBF + noise, softplus constraints on lengthscale, variance and noise variance,
float64, adam(0.01), x = linspace(0, 10, n), y = sin(x) + 0.1·noise, initial
lengthscale 1, variance 1, noise 0.5. Variants:

- hand-written JAX: a dict of unconstrained arrays and a Cholesky NLML, as a jitted
  Python loop and as one `lax.scan` (losses recorded, as `ep.fit` does);
- hand-written JAX calling raw distrax's `MultivariateNormalTri.log_prob`: the
  same maths as the eqxprob model, without eqxprob, so any HLO difference between
  this row and the eqxprob rows is eqxprob's;
- eqxprob `Bijector` + `resolve` (the model of examples/gp_regression.py, built
  with `ep.parameterize`), an `eqx.filter_jit` step in a Python loop;
- eqxprob registry `unconstrain`/`constrain`, the same loop;
- `ep.fit` (chunks of 100 `lax.scan` steps);
- paramax (`paramax.Parameterize(softplus, ·)` leaves, `paramax.unwrap`), the same
  loop, and GPJax 1.0 both as a jitted step and through `gpx.fit` as its docs show.
  These need `pip install -e .[bench]` (`make bench` does it); without them their
  rows say "not installed".

The variants are timed in interleaved rounds (every variant once per round, each
from its initial values, the order rotated each round), and the median round is
reported, so a burst of load on the machine hits all variants alike. Per variant:
the compile time (first call minus a median one), median ms per step, its ratio to
the faster hand-written loop (also with each variant's fastest round), the number
of loss traces after the first call (recompiles), the compiled HLO instruction
count (of the step for the Python loops; of the loop body, i.e. one step, for the
scan variants), the LAPACK calls in it, and the final NLML and hyperparameters,
which must agree with the hand-written loop to 1e-6 relative.

At n ≥ 1000 the Cholesky dominates and one step takes 0.1-3 s on two cores, so
those sizes run `--large-steps` steps (default 10) instead of 500.

Run: `python benchmarks/gp_training.py [--quick] [--steps N] [--rounds R]`
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import pathlib
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import count_hlo_ops, table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from gp_regression import initial_model, make_data  # noqa: E402

import eqxprob as ep  # noqa: E402


OPTIMISER = optax.adam(0.01)
INITIAL = {"ls": 1.0, "var": 1.0, "noise": 0.5}


def _inv_softplus(v: float) -> jax.Array:
    return jnp.log(jnp.expm1(jnp.asarray(v, jnp.float64)))


def _kernel_matrix(ls, var, noise, x):
    k = var * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2)
    return k + noise * jnp.eye(x.shape[0], dtype=x.dtype)


def _nlml(ls, var, noise, x, y) -> jax.Array:
    """The hand-written negative log marginal likelihood: one Cholesky, one solve."""
    lower = jnp.linalg.cholesky(_kernel_matrix(ls, var, noise, x))
    alpha = jax.scipy.linalg.solve_triangular(lower, y, lower=True)
    n = x.shape[0]
    return (
        0.5 * alpha @ alpha
        + jnp.sum(jnp.log(jnp.diag(lower)))
        + 0.5 * n * jnp.log(2 * jnp.pi)
    )


def _softplus_dict(p: dict) -> tuple:
    return tuple(jax.nn.softplus(p[k]) for k in ("ls", "var", "noise"))


def _hand_nlml(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return _nlml(*_softplus_dict(p), x, y)


def _distrax_nlml(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    lower = jnp.linalg.cholesky(_kernel_matrix(*_softplus_dict(p), x))
    return -distrax.MultivariateNormalTri(jnp.zeros_like(x), lower).log_prob(y)


def _hand_params() -> dict:
    return {k: _inv_softplus(v) for k, v in INITIAL.items()}


@dataclasses.dataclass
class Variant:
    """One way of training: `call(steps)` trains from the initial values."""

    name: str
    call: Callable[[int], Any]
    summary: Callable[[Any], np.ndarray]  # trained -> (nlml, ls, var, noise)
    hlo: Callable[[], str] | None = None  # compiled HLO text to count
    scan: bool = False  # count one step: the body of the HLO's while loop
    traces: _Count = dataclasses.field(default_factory=lambda: _Count())


class _Count:
    """A trace counter, bumped through a method: `ep.fit` compares a loss by what
    it reads, the values of the attributes it reads included (a `box.value += 1`
    in the loss would make every call a new loss, compiled again), but not the
    methods it calls."""

    def __init__(self):
        self.value = 0

    def add(self) -> None:
        self.value += 1


def _counted(loss: Callable, box: _Count) -> Callable:
    """`loss`, counting its Python calls: once per trace under jit."""

    def counted(*args):
        box.add()
        return loss(*args)

    return counted


def _step_fn(loss: Callable) -> Callable:
    def step(params, state):
        value, grads = eqx.filter_value_and_grad(loss)(params)
        updates, state = OPTIMISER.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, value

    return step


def _loop(name, params, loss, summary, jit=eqx.filter_jit) -> Variant:
    """A jitted step called from a Python loop."""
    variant = Variant(name, None, summary)
    step = _step_fn(_counted(loss, variant.traces))
    jitted = jit(step)

    def call(steps: int):
        p, state = params, OPTIMISER.init(eqx.filter(params, eqx.is_inexact_array))
        for _ in range(steps):
            p, state, value = jitted(p, state)
        return jax.block_until_ready(p)

    def hlo() -> str:
        state = OPTIMISER.init(eqx.filter(params, eqx.is_inexact_array))
        lowered = eqx.filter_jit(_step_fn(loss)).lower(params, state)
        return lowered.lowered.compile().as_text()

    variant.call, variant.hlo = call, hlo
    return variant


def _hand_scan(params, loss, summary) -> Variant:
    """One `lax.scan` over all steps, losses recorded: the fastest hand-written form."""
    variant = Variant("hand-written, lax.scan", None, summary, scan=True)
    step = _step_fn(_counted(loss, variant.traces))

    def body(carry, _):
        p, state, value = step(*carry)
        return (p, state), value

    run = jax.jit(
        lambda p, s, steps: jax.lax.scan(body, (p, s), None, length=steps),
        static_argnums=2,
    )

    def call(steps: int):
        (p, _), losses = run(params, OPTIMISER.init(params), steps)
        return jax.block_until_ready(p)

    def hlo() -> str:
        return run.lower(params, OPTIMISER.init(params), 100).compile().as_text()

    variant.call, variant.hlo = call, hlo
    return variant


def _fit(model, loss, summary) -> Variant:
    variant = Variant("eqxprob ep.fit", None, summary, scan=True)
    counted = _counted(loss, variant.traces)

    def call(steps: int):
        trained, _ = ep.fit(
            model, counted, optimiser=OPTIMISER, steps=steps, progress=False
        )
        return jax.block_until_ready(trained)

    def hlo() -> str:  # `ep.fit` of 100 steps under `jax.jit`: its chunk, inlined
        def train(m):
            return ep.fit(m, loss, optimiser=OPTIMISER, steps=100, progress=False)

        return jax.jit(train).lower(model).compile().as_text()

    variant.call, variant.hlo = call, hlo
    return variant


def _eqxprob_variants(x, y) -> list[Variant]:
    def summary(gp) -> np.ndarray:
        return np.array(
            [gp.nlml(x, y), gp.kernel.lengthscale, gp.kernel.variance, gp.noise]
        )

    bijector_model = ep.parameterize(initial_model())
    resolve_loss = lambda m: ep.resolve(m).nlml(x, y)  # noqa: E731
    return [
        _loop(
            "eqxprob Bijector + resolve",
            bijector_model,
            resolve_loss,
            lambda m: summary(ep.resolve(m)),
        ),
        _loop(
            "eqxprob registry constrain",
            ep.unconstrain(initial_model()),
            lambda m: ep.constrain(m).nlml(x, y),
            lambda m: summary(ep.constrain(m)),
        ),
        _fit(bijector_model, resolve_loss, lambda m: summary(ep.resolve(m))),
    ]


def _paramax_variants(x, y) -> list[Variant]:
    import paramax

    class GP(eqx.Module):
        ls: Any
        var: Any
        noise: Any

    model = GP(
        *(
            paramax.Parameterize(jax.nn.softplus, _inv_softplus(INITIAL[k]))
            for k in INITIAL
        )
    )

    def loss(m):
        gp = paramax.unwrap(m)
        return _nlml(gp.ls, gp.var, gp.noise, x, y)

    def summary(m) -> np.ndarray:
        gp = paramax.unwrap(m)
        return np.array([loss(m), gp.ls, gp.var, gp.noise])

    return [_loop("paramax, filter_jit loop", model, loss, summary)]


def _gpjax_variants(x, y) -> list[Variant]:
    import gpjax as gpx
    import paramax
    from gpjax.parameters import val

    class NoiseStddev(paramax.AbstractUnwrappable):
        """GPJax's Gaussian likelihood takes a standard deviation; this one is
        trained as softplus(u) = noise *variance*, as every other variant is."""

        u: jax.Array

        def unwrap(self):
            return jnp.sqrt(jax.nn.softplus(self.u))

    data = gpx.Dataset(X=x[:, None], y=y[:, None])
    kernel = gpx.kernels.RBF(lengthscale=INITIAL["ls"], variance=INITIAL["var"])
    prior = gpx.gps.Prior(
        mean_function=gpx.mean_functions.Zero(), kernel=kernel, jitter=0.0
    )
    likelihood = eqx.tree_at(
        lambda lik: lik.obs_stddev,
        gpx.likelihoods.Gaussian(),
        NoiseStddev(_inv_softplus(INITIAL["noise"])),
    )
    posterior = prior * likelihood
    nmll = lambda m, d: -gpx.objectives.conjugate_mll(m, d)  # noqa: E731

    def summary(m) -> np.ndarray:
        k = m.prior.kernel
        return np.array(
            [
                nmll(m, data),
                val(k.lengthscale),
                val(k.variance),
                val(m.likelihood.obs_stddev) ** 2,
            ]
        )

    loop = _loop("GPJax, filter_jit loop", posterior, lambda m: nmll(m, data), summary)
    fit = Variant("GPJax gpx.fit (as documented)", None, summary)
    counted = _counted(nmll, fit.traces)

    def call(steps: int):
        trained, _ = gpx.fit(
            model=posterior,
            objective=counted,
            train_data=data,
            optim=OPTIMISER,
            num_iters=steps,
            verbose=False,
        )
        return jax.block_until_ready(trained)

    fit.call = call
    return [loop, fit]


def _lapack_calls(hlo: str) -> str:
    calls = collections.Counter(
        re.findall(r'custom_call_target="lapack_(\w+?)_ffi"', hlo)
    )
    return " ".join(f"{name}×{count}" for name, count in sorted(calls.items()))


def run(n: int, steps: int, rounds: int) -> list[list]:
    x, y = make_data(n)
    hand = _hand_params()
    hand_summary = lambda p: np.array(  # noqa: E731
        [_hand_nlml(p, x, y), *_softplus_dict(p)]
    )
    variants = [
        _loop(
            "hand-written, jitted loop",
            hand,
            lambda p: _hand_nlml(p, x, y),
            hand_summary,
            jit=jax.jit,
        ),
        _hand_scan(hand, lambda p: _hand_nlml(p, x, y), hand_summary),
        _loop(
            "hand-written + raw distrax",
            hand,
            lambda p: _distrax_nlml(p, x, y),
            hand_summary,
            jit=jax.jit,
        ),
        *_eqxprob_variants(x, y),
    ]
    missing = []
    for library, make in [("paramax", _paramax_variants), ("gpjax", _gpjax_variants)]:
        if importlib.util.find_spec(library) is None:
            missing.append(library)
        else:
            variants += make(x, y)

    first, trained, after_first = {}, {}, {}
    for v in variants:
        start = time.perf_counter()
        trained[v.name] = v.call(steps)
        first[v.name] = time.perf_counter() - start
        after_first[v.name] = v.traces.value
    times = collections.defaultdict(list)
    for r in range(rounds):  # each round starts one variant later: no fixed order
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            start = time.perf_counter()
            trained[v.name] = v.call(steps)
            times[v.name].append((time.perf_counter() - start) / steps)

    hand = ("hand-written, jitted loop", "hand-written, lax.scan")
    median = {name: statistics.median(t) for name, t in times.items()}
    fastest = {name: min(t) for name, t in times.items()}
    median_base = min(median[name] for name in hand)
    fastest_base = min(fastest[name] for name in hand)
    reference = variants[0].summary(trained[variants[0].name])
    rows = []
    for v in variants:
        summary = v.summary(trained[v.name])
        hlo = v.hlo() if v.hlo is not None else None
        rows.append(
            [
                n,
                v.name,
                f"{first[v.name] - median[v.name] * steps:.2f}",
                f"{median[v.name] * 1e3:.3f}",
                f"{median[v.name] / median_base:.3f}",
                f"{fastest[v.name] / fastest_base:.3f}",
                v.traces.value - after_first[v.name],
                "-" if hlo is None else count_hlo_ops(hlo, loop_body=v.scan),
                "-" if hlo is None else _lapack_calls(hlo),
                f"{summary[0]:.6f}",
                " ".join(f"{s:.5f}" for s in summary[1:]),
                "yes" if np.allclose(summary, reference, rtol=1e-6, atol=0) else "NO",
            ]
        )
    for library in missing:
        rows.append([n, f"{library}: not installed (the bench extra)"] + [""] * 10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 200 only")
    parser.add_argument("--steps", type=int, default=500, help="steps at n = 200")
    parser.add_argument("--large-steps", type=int, default=10, help="steps at n ≥ 1000")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds at n = 200")
    args = parser.parse_args()
    sizes = [200] if args.quick else [200, 1000, 3000]
    rows = []
    for n in sizes:
        steps = args.steps if n <= 200 else args.large_steps
        rounds = args.rounds if n <= 200 else max(1, args.rounds // 2)
        rows += run(n, steps, rounds)
        print(f"n = {n} done", file=sys.stderr)
    header = [
        "n",
        "variant",
        "compile s",
        "ms/step",
        "vs hand",
        "min vs hand",
        "recompiles",
        "HLO ops",
        "LAPACK calls",
        "final NLML",
        "lengthscale variance noise",
        "agree 1e-6",
    ]
    print(
        f"Exact GP training, adam(0.01), float64, steps: {args.steps} at n = 200, "
        f"{args.large_steps} at n ≥ 1000; median of interleaved rounds"
    )
    print(table(header, rows))
    print(
        "'compile s': how much longer the first call took than a median one (gpx.fit "
        "compiles in every call, so for it that cost is inside ms/step). "
        "'vs hand': median ms/step over that of the faster hand-written loop; 'min vs "
        "hand': the same with each variant's fastest round. 'recompiles': "
        "loss traces after the first call. 'HLO ops': the compiled step for the Python "
        "loops; for lax.scan and ep.fit the scan's loop body (one step, plus the "
        "loop's own counter and tuple instructions)."
    )


if __name__ == "__main__":
    main()
