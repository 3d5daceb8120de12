"""What `ep.fit`'s trace at every call costs, against a compile, on the GP and
SVGP examples.

`ep.fit` traces the loss and optimiser and lowers its chunk at every call, and
reuses a compiled program only for an identical lowering. Per example:

- **first call** (1 step): trace, lower and compile (a loss never traced
  before: it adds a new tiny number, a constant of the program, so the program
  is new);
- **warm call** (1 step), same objects, and with a fresh but equal loss and
  optimiser: trace and lower, the compiled program reused, one step run;
- **hand-written step**: a warm `jax.jit` of one step of the same maths;

and the ratios warm / first (what the trace costs against a compile) and warm
minus a hand-written step (the per-call price in milliseconds). A second table
times a repeated call of 5 steps whose loss closes over 2,000 or 2,000,000
floats (and reads six of them): arrays over 1 MiB the loss closes over are
inputs of the program, not its text, so the larger is never lowered again.
Medians of `--rounds` rounds. Asserts nothing.

Run: `OPENBLAS_NUM_THREADS=1 python benchmarks/fit_trace.py [--quick] [--rounds R]`
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from _common import table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import gp_regression  # noqa: E402
import svgp_classification as svgp  # noqa: E402

import eqxprob as ep  # noqa: E402


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


class Example:
    def __init__(self, name, make_model, make_loss, kwargs):
        self.name, self.make_model, self.make_loss = name, make_model, make_loss
        self.kwargs = kwargs
        self.model, self.loss = make_model(), make_loss()
        self.optimiser = optax.adam(0.01)

    def fit(self, model, loss, optimiser) -> Any:
        return ep.fit(
            model, loss, optimiser=optimiser, steps=1, progress=False, **self.kwargs
        )

    def first(self, r: int) -> float:
        tiny = 1e-30 * (r + 1 + time.time() % 1)  # (a program never compiled)
        new = lambda *a, **k: self.loss(*a, **k) + tiny  # noqa: E731
        return _timed(lambda: self.fit(self.model, new, self.optimiser))

    def warm(self) -> float:
        return _timed(lambda: self.fit(self.model, self.loss, self.optimiser))

    def warm_fresh(self) -> float:
        return _timed(lambda: self.fit(self.model, self.make_loss(), optax.adam(0.01)))

    def hand_step(self) -> float:
        params, static = eqx.partition(self.model, ep.trainable(self.model))
        optimiser = optax.adam(0.01)
        batch = self.kwargs.get("data")
        if "batch_size" in self.kwargs:
            batch = jax.tree.map(lambda d: d[: self.kwargs["batch_size"]], batch)
        args = () if batch is None else (batch,)

        @jax.jit
        def step(p, s):
            def value(q):
                return self.loss(eqx.combine(q, static), *args)

            v, g = jax.value_and_grad(value)(p)
            u, s = optimiser.update(g, s, p)
            return optax.apply_updates(p, u), s, v

        state = optimiser.init(params)
        _timed(lambda: step(params, state))
        return statistics.median(_timed(lambda: step(params, state)) for _ in range(5))


def gp() -> Example:
    x, y = gp_regression.make_data(200)
    return Example(
        "GP regression (n=200, f64)",
        lambda: ep.parameterize(gp_regression.initial_model()),
        lambda: lambda m: ep.resolve(m).nlml(x, y),
        {},
    )


def svgp_example(n: int) -> Example:
    key = jax.random.key(0)
    x, y = svgp.make_data(n, key)
    z = x[:32]
    return Example(
        f"SVGP classification (N={n}, M=32, batch 256)",
        lambda: svgp.SVGP.init(jnp.asarray(z)),
        lambda: svgp.make_loss(n),
        {"data": (x, y), "batch_size": 256, "key": key},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    examples = [gp(), svgp_example(2_000 if args.quick else 100_000)]
    rows = []
    for ex in examples:
        ex.warm()
        first, warm, fresh = [], [], []
        for r in range(rounds):
            first.append(ex.first(r))
            warm.append(ex.warm())
            fresh.append(ex.warm_fresh())
        hand = ex.hand_step()
        f, w, e = map(statistics.median, (first, warm, fresh))
        rows.append(
            [
                ex.name,
                f"{f * 1e3:.1f} ms",
                f"{w * 1e3:.1f} ms",
                f"{e * 1e3:.1f} ms",
                f"{hand * 1e3:.2f} ms",
                f"{w / f:.3f}",
                f"{(w - hand) * 1e3:.1f} ms",
            ]
        )
    print(
        f"ep.fit, 1 step: trace + lower at every call vs a compile, {rounds} rounds, "
        f"jax {jax.__version__}, {jax.devices()[0].platform}"
    )
    header = ["example", "first call", "warm call", "warm, fresh equal objects"]
    header += ["hand step", "warm / first", "warm - hand step"]
    print(table(header, rows))
    print(closed_over_data(rounds))


def closed_over_data(rounds: int) -> str:
    """A repeated call of 5 steps whose loss closes over `n` floats."""
    times = {}
    for n in (2_000, 2_000_000):
        data = jnp.linspace(0.0, 1.0, n)

        def call(data=data):
            loss = lambda p: jnp.sum((p - data[:3] - data[-3:]) ** 2)  # noqa: E731
            return ep.fit(jnp.zeros(3), loss, optimiser=optax.sgd(0.1), steps=5,
                          progress=False)  # fmt: skip

        call()
        times[n] = statistics.median(_timed(call) for _ in range(max(rounds, 5)))
    rows = [[f"{n:,}", f"{t * 1e3:.1f} ms"] for n, t in times.items()]
    rows.append(["ratio", f"{times[2_000_000] / times[2_000]:.2f}"])
    return table(["floats the loss closes over", "repeated 5-step call"], rows)


if __name__ == "__main__":
    main()
