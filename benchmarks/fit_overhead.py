"""What `ep.fit`'s machinery costs: `ep.fit` against a hand-written `jax.jit` of
`optax.init` plus a `lax.scan` of steps (losses recorded), on the same model.

Rows:

- **per step**, exact-GP NLML (the GP regression example: RBF + noise, three
  softplus-constrained hyperparameters, float64, adam(0.01)) at n = 20, where a
  step is a few microseconds of work and the loop machinery shows, and at n = 200:
  a warm call's time over its steps, less, for `ep.fit`, a call of one step, so
  that a call's own costs (`ep.fit`'s trace) drop out. (Not the difference of
  calls of S and 2S steps: a hand-written `jit(scan)` of each is its own program.)
  The hand-written loss is raw distrax's `MultivariateNormalTri` on
  softplus of a dict of arrays: the model's maths without eqxprob.
- **whole call**, a 2-parameter least-squares problem (`a·x + b` to 32 points,
  float32, adam(0.05)) at 100, 3,000 and 30,000 steps: a warm call from the model
  to the trained model and losses, setup and all. (At 100 steps the hand-written
  loop's whole state is under XLA:CPU's 1 KB "small while loop" threshold, so it
  runs as one compiled kernel at about a third of the per-step cost of a loop run
  op by op; `ep.fit`'s loss buffer, `chunk_size` long, keeps it out of that path.)
- **whole call**, the GP regression example as it runs (n = 200, 500 steps):
  with the same loss and optimiser objects at every call, and with a fresh but
  equal `lambda` and `optax.adam(0.01)` at every call. `ep.fit` traces and
  lowers the chunk at every call (reusing the compiled program); the hand-written
  `jax.jit` is warm.
- **fixed cost**, first call minus a warm one of the same 100 steps, each first
  call on a new model structure (a fresh `eqx.Module` class; for the hand-written
  loop also a fresh `jax.jit`), so it traces and compiles: for the 2-parameter
  problem and the n = 20 GP.

Every row runs both sides in each round: the warm rows call the two in turn,
call by call (hand, fit, fit, hand, ...), and the fixed-cost rows once each, in
an order that alternates between rounds, so a burst of load hits both alike.
Reported: the median time of each side, the median and range of the per-round
ratios `ep.fit / hand-written`, and the ratio of the fastest rounds. `ep.fit`
runs with `progress=False` and otherwise its defaults. Asserts nothing.

Run: `OPENBLAS_NUM_THREADS=1 python benchmarks/fit_overhead.py [--quick] [--rounds R]`
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from _common import table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from gp_regression import ExactGP, initial_model, make_data  # noqa: E402

import eqxprob as ep  # noqa: E402


def hand_runner(loss: Callable, optimiser: Any, steps: int) -> Callable:
    """`run(params) -> (params, losses)`: init and `steps` steps in one `jax.jit`."""

    def body(carry, _):
        p, state = carry
        value, grads = jax.value_and_grad(loss)(p)
        updates, state = optimiser.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), value

    @jax.jit
    def run(p):
        (p, _), losses = jax.lax.scan(body, (p, optimiser.init(p)), None, length=steps)
        return p, losses

    return run


class Problem:
    """One training problem, for `ep.fit` and by hand."""

    def __init__(self, model, loss, hand_params, hand_loss, rate):
        self.model, self.loss = model, loss
        self.hand_params, self.hand_loss = hand_params, hand_loss
        self.optimiser, self.optimiser_rate = optax.adam(rate), rate

    def fit(self, steps: int, model: Any = None) -> Callable[[], Any]:
        model = self.model if model is None else model
        return lambda: ep.fit(
            model, self.loss, optimiser=self.optimiser, steps=steps, progress=False
        )

    def fit_fresh(self, steps: int) -> Callable[[], Any]:
        """`ep.fit` with a fresh but equal loss and optimiser at every call."""
        rate = self.optimiser_rate
        return lambda: ep.fit(
            self.model,
            lambda m: self.loss(m),
            optimiser=optax.adam(rate),
            steps=steps,
            progress=False,
        )

    def hand(self, steps: int, params: Any = None) -> Callable[[], Any]:
        params = self.hand_params if params is None else params
        run = hand_runner(self.hand_loss, self.optimiser, steps)
        return lambda: run(params)


def _softplus_inverse(v: float) -> jax.Array:
    return jnp.log(jnp.expm1(jnp.asarray(v, jnp.float64)))


def gp_problem(n: int) -> Problem:
    x, y = make_data(n)

    def hand_loss(p):
        ls, var, noise = (jax.nn.softplus(p[k]) for k in ("ls", "var", "noise"))
        k = var * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2)
        lower = jnp.linalg.cholesky(k + noise * jnp.eye(n, dtype=x.dtype))
        return -distrax.MultivariateNormalTri(jnp.zeros_like(x), lower).log_prob(y)

    hand = {"ls": 1.0, "var": 1.0, "noise": 0.5}
    return Problem(
        ep.parameterize(initial_model()),
        lambda m: ep.resolve(m).nlml(x, y),
        {k: _softplus_inverse(v) for k, v in hand.items()},
        hand_loss,
        0.01,
    )


def line_class(name: str = "Line") -> type:
    """A fresh `eqx.Module` class with two array fields `a` and `b`."""
    return type(name, (eqx.Module,), {"__annotations__": {"a": Any, "b": Any}})


Line = line_class()
X = jnp.linspace(0.0, 1.0, 32, dtype=jnp.float32)
Y = 2.0 * X + 1.0 + 0.1 * jax.random.normal(jax.random.key(0), (32,), jnp.float32)


def line_loss(m):
    return jnp.mean((m.a * X + m.b - Y) ** 2)


def line_model(cls: type = Line) -> Any:
    return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))


def line_problem() -> Problem:
    return Problem(line_model(), line_loss, line_model(), line_loss, 0.05)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _warm(fn: Callable[[], Any], repeat: int) -> float:
    return statistics.median(_timed(fn) for _ in range(repeat))


class Row:
    """A row of the table: `measure(r)` returns `(hand, fit)` seconds for round `r`,
    the two sides run in an order that alternates between rounds."""

    def __init__(self, name: str, unit: str, scale: float, measure: Callable):
        self.name, self.unit, self.scale, self.measure = name, unit, scale, measure
        self.hand: list[float] = []
        self.fit: list[float] = []

    def run(self, r: int) -> None:
        hand, fit = self.measure(r)
        self.hand.append(hand)
        self.fit.append(fit)

    def cells(self) -> list[str]:
        ratios = [f / h for f, h in zip(self.fit, self.hand)]
        hand, fit = statistics.median(self.hand), statistics.median(self.fit)
        return [
            self.name,
            f"{hand * self.scale:.3g} {self.unit}",
            f"{fit * self.scale:.3g} {self.unit}",
            f"{statistics.median(ratios):.3f}",
            f"{min(ratios):.2f}-{max(ratios):.2f}",
            f"{min(self.fit) / min(self.hand):.3f}",
        ]


def _pair(r: int, hand: Callable[[], float], fit: Callable[[], float]) -> tuple:
    if r % 2:
        f = fit()
        return hand(), f
    h = hand()
    return h, fit()


def _alternating(r: int, hand: Callable, fit: Callable, repeat: int) -> tuple:
    """Median times of `repeat` warm calls of each side, the two sides called
    in turn (hand, fit, fit, hand, ...), so that a burst of load on the shared
    machine lands on both alike rather than on one side's block of calls."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeat):
        for side in (0, 1) if (r + i) % 2 == 0 else (1, 0):
            times[side].append(_timed((hand, fit)[side]))
    return statistics.median(times[0]), statistics.median(times[1])


def per_step_row(name: str, problem: Problem, steps: int, repeat: int) -> Row:
    """Per step without a call's own costs: the hand-written call of `steps`
    steps (one program), and `ep.fit`'s call less its call of one step (its
    trace and lowering), over `steps`."""
    hand, fit, one = problem.hand(steps), problem.fit(steps), problem.fit(1)
    for fn in (hand, fit, one):
        _timed(fn), _timed(fn)  # compile, then the warm path

    def measure(r):
        h, f = _alternating(r, hand, fit, repeat)
        call = statistics.median(_timed(one) for _ in range(repeat))
        return h / steps, (f - call) / steps

    return Row(f"{name}, per step ({steps} steps)", "µs", 1e6, measure)


def whole_call_row(
    name: str, problem: Problem, steps: int, repeat: int, fresh: bool = False
) -> Row:
    hand = problem.hand(steps)
    fit = problem.fit_fresh(steps) if fresh else problem.fit(steps)
    _timed(hand), _timed(fit), _timed(fit)

    def measure(r):
        return _alternating(r, hand, fit, repeat)

    which = ", fresh equal loss and optimiser" if fresh else ""
    return Row(f"{name}, whole call, {steps} steps{which}", "ms", 1e3, measure)


_FRESH = [0]


def fixed_cost_row(name: str, problem: Problem, fresh: Callable, steps: int) -> Row:
    """`fresh(problem)`: a new `(model, hand_params)` pair, of a structure never
    compiled before."""

    def first_minus_warm(make: Callable[[], Callable[[], Any]]) -> float:
        fn = make()
        first = _timed(fn)
        return first - _warm(fn, 5)

    def measure(r):
        model, params = fresh(problem)
        return _pair(
            r,
            lambda: first_minus_warm(lambda: problem.hand(steps, params)),
            lambda: first_minus_warm(lambda: problem.fit(steps, model)),
        )

    return Row(f"{name}, fixed cost (first − warm, {steps} steps)", "ms", 1e3, measure)


def fresh_line(problem: Problem) -> tuple:
    _FRESH[0] += 1
    cls = line_class(f"Line{_FRESH[0]}")
    return line_model(cls), line_model(cls)


def fresh_gp(problem: Problem) -> tuple:
    _FRESH[0] += 1
    cls = type(f"ExactGP{_FRESH[0]}", (ExactGP,), {})
    gp = initial_model()
    model = ep.parameterize(cls(gp.kernel, gp.noise))
    # A dict with fresh keys would need a fresh loss; the fresh `jax.jit` of
    # `Problem.hand` already traces and compiles from scratch.
    return model, problem.hand_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, 1 round")
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (quick 1)")
    args = parser.parse_args()
    quick = args.quick
    rounds = args.rounds or (1 if quick else 7)
    repeat = 1 if quick else 5
    gp20, gp200, line = gp_problem(20), gp_problem(200), line_problem()
    gp_steps, gp_calls = (5, 1) if quick else (500, 3)
    rows = [
        per_step_row("GP n=20", gp20, 50 if quick else 3000, repeat),
        per_step_row("GP n=200", gp200, 5 if quick else 200, 1 if quick else 3),
        whole_call_row("GP n=200", gp200, gp_steps, gp_calls),
        whole_call_row("GP n=200", gp200, gp_steps, gp_calls, fresh=True),
        *(
            whole_call_row("2-param", line, steps, 1 if quick else calls)
            for steps, calls in (
                ((100, 51), (1_000, 11), (3_000, 5))
                if quick
                else ((100, 51), (3_000, 11), (30_000, 5))
            )
        ),
        fixed_cost_row("2-param", line, fresh_line, 100),
        fixed_cost_row("GP n=20", gp20, fresh_gp, 10 if quick else 100),
    ]
    for r in range(rounds):
        for row in rows:
            row.run(r)
    print(
        f"ep.fit vs hand-written jit(init + lax.scan), {rounds} interleaved rounds, "
        f"jax {jax.__version__}, {jax.devices()[0].platform}"
    )
    header = ["row", "hand", "ep.fit", "ratio", "range", "ratio of mins"]
    print(table(header, [row.cells() for row in rows]))


if __name__ == "__main__":
    main()
