"""Natural gradients for an SVGP classifier: eqxprob against adam and GPJax 1.0.

The problem is `examples/svgp_classification.py`'s: x uniform on [-3, 3]², y ~
Bernoulli(σ(6 sin x₀ cos x₁)), the whitened SVGP with GPJax's probit link (Φ
squeezed into [1e-3, 1 - 1e-3], 20-point Gauss–Hermite, jitter 1e-6) so that GPJax's
`WhitenedVariationalGaussian` with its `Bernoulli` maximises the same ELBO; the
inducing inputs are M random rows of x, minibatches of B rows drawn with
replacement, float64, CPU unless a device is present. Three ways to train:

- adam: `ep.fit(..., optimiser=optax.adam(0.01))` on every parameter;
- natural gradients + adam: `ep.natural_gradient(rate, optax.adam(lr))` (q(v) by
  natural gradients, the kernel and inducing inputs by adam at the updated q(v)),
  both step sizes halved every 100 steps (rate 0.2 to 0.005, lr 0.05 to 0.002: at
  a constant rate the minibatch noise holds the ELBO ~0.5% below its best), or
  `--rate R` with adam(0.01);
- GPJax 1.0: `gpx.fit_natgrads(..., optim=optax.adam(lr), natgrad_lr=rate)` with
  the same schedules, wrapped in `eqx.filter_jit` so that its `lax.scan` compiles
  once (per-step time only: it draws its minibatches differently).

Table 1: milliseconds per step over S steps (the fastest of interleaved rounds,
after compiling calls), each one's ratio to GPJax's `fit_natgrads`: eqxprob's
step (the loss's value and gradient, then the optimiser's `update` with
`value_fn=`, exactly `ep.fit`'s step) in one jitted `lax.scan`, as GPJax's, and
through `ep.fit` itself (which traces the loss and looks its program up at every
call). Table 2: the full-data ELBO
at checkpoints (an `ep.fit` resumed from its `FitState`, so the trajectory is one
long fit's), and for each way the first checkpoint within 0.1% of the best ELBO
either reaches: steps, and wall time = steps × its time per step in the
`lax.scan` (the ELBO evaluations are not counted).

Run: `python benchmarks/natgrad.py [--quick] [--n N] [--m M] [--batch B]
[--rate RATE] [--adam-steps S] [--natgrad-steps S] [--rounds R] [--plot PNG]`;
`--plot docs/img/natgrad.png` draws the how-to's figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

import equinox as eqx
import jax
import numpy as np
import optax
from _common import table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from svgp_classification import SVGP, elbo, make_data, make_loss  # noqa: E402

import eqxprob as ep  # noqa: E402


JITTER = 1e-6


def problem(n: int, m: int):
    """Data, inducing inputs and the initial model (q(v) = N(0, I))."""
    key_data, key_z = jax.random.split(jax.random.key(0))
    x, y = make_data(n, key_data)
    z = x[jax.random.choice(key_z, n, (m,), replace=False)]
    return x, y, z, SVGP.init(z, link="probit", jitter=JITTER)


def decay(start: float, end: float) -> optax.Schedule:
    """Halved every 100 steps, from `start` down to `end`."""
    return optax.exponential_decay(start, 100, 0.5, end_value=end)


def optimisers(rate: float | None) -> dict:
    """adam alone, as the example trains; natural gradients + adam, both step
    sizes decaying (minibatch noise otherwise holds the ELBO ~0.5% below its
    best), or at a constant natural-gradient `rate` with adam(0.01)."""
    natural = (
        ep.natural_gradient(decay(0.2, 0.005), optax.adam(decay(0.05, 0.002)))
        if rate is None
        else ep.natural_gradient(rate, optax.adam(0.01))
    )
    return {"adam": optax.adam(0.01), "natural gradients + adam": natural}


def timed_ep(model, optimiser, x, y, batch):
    """A call that trains `steps` steps with `ep.fit` from `model`."""
    loss = make_loss(x.shape[0])

    def call(steps):
        trained, _ = ep.fit(
            model, loss, optimiser=optimiser, steps=steps, data=(x, y),
            batch_size=batch, key=jax.random.key(1), progress=False,
        )  # fmt: skip
        return jax.block_until_ready(trained)

    return call


def timed_scan(model, optimiser, x, y, batch):
    """A call that trains `steps` steps as `ep.fit`'s step does (the loss's
    value and gradient, then `optimiser.update` with `value_fn=`), in one jitted
    `lax.scan`: the time of a step without `ep.fit`'s per-call cost."""
    n = x.shape[0]
    loss = make_loss(n)
    params, static = ep.partition(model)

    @eqx.filter_jit
    def run(params, steps):
        def body(carry, i):
            p, state = carry
            key = jax.random.fold_in(jax.random.key(1), i)
            rows = jax.random.randint(key, (batch,), 0, n)
            value_fn = lambda q: loss(eqx.combine(q, static), (x[rows], y[rows]))  # noqa: E731
            value, grad = jax.value_and_grad(value_fn)(p)
            with jax.numpy_dtype_promotion("standard"):  # (optax: as `ep.fit`)
                updates, state = optimiser.update(
                    grad, state, p, value=value, grad=grad, value_fn=value_fn
                )
                p = optax.apply_updates(p, updates)
            return (p, state), value

        start = (params, optimiser.init(params))
        return jax.lax.scan(body, start, jax.numpy.arange(steps))[0][0]

    def call(steps):
        return jax.block_until_ready(run(params, steps))

    return call


def timed_gpjax(x, y, z, batch, rate):
    """A call that trains `steps` iterations of GPJax 1.0's `fit_natgrads`, and
    GPJax's ELBO of the initial family (to check both maximise one ELBO)."""
    import gpjax as gpx

    data = gpx.Dataset(X=x, y=y[:, None])
    prior = gpx.gps.Prior(
        mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF(),
        jitter=JITTER,
    )  # fmt: skip
    posterior = prior * gpx.likelihoods.Bernoulli()  # pyright: ignore[reportCallIssue]
    q = gpx.variational_families.WhitenedVariationalGaussian(
        model=posterior, inducing_inputs=z
    )

    if rate is None:  # (the schedules of `optimisers`)
        optim, natgrad_lr = optax.adam(decay(0.05, 0.002)), decay(0.2, 0.005)
    else:
        optim, natgrad_lr = optax.adam(0.01), rate

    @eqx.filter_jit
    def run(q, steps):
        trained, _ = gpx.fit_natgrads(
            model=q, objective=lambda p, d: -gpx.objectives.elbo(p, d),
            train_data=data, optim=optim, natgrad_lr=natgrad_lr,
            num_iters=steps, batch_size=batch, key=jax.random.key(1),
            verbose=False, safe=False,
        )  # fmt: skip
        return trained

    def call(steps):
        return jax.block_until_ready(run(q, steps))

    with jax.numpy_dtype_promotion("standard"):
        initial = float(gpx.objectives.elbo(q, data))
    return call, initial


def per_step(calls: dict, steps: int, rounds: int) -> dict:
    """Each call's seconds per step over a call of `steps` steps: the fastest of
    interleaved rounds (other work on the machine only adds time), after a
    compiling call."""
    for call in calls.values():
        call(steps)
    times: dict = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name](steps)
            times[name].append((time.perf_counter() - start) / steps)
    return {name: min(t) for name, t in times.items()}


def trace(model, optimiser, x, y, batch, checkpoints) -> list[float]:
    """The full-data ELBO at each checkpoint of one fit (resumed between them)."""
    n = x.shape[0]
    loss = make_loss(n)
    full = jax.jit(lambda mdl: elbo(ep.resolve(mdl), x, y, n))
    state, done, out = None, 0, []
    for c in checkpoints:
        model, _, state = ep.fit(
            model, loss, optimiser=optimiser, steps=c - done, data=(x, y),
            batch_size=batch, key=jax.random.key(1), progress=False, state=state,
            return_state=True,
        )  # fmt: skip
        done = c
        out.append(float(full(model)))
    return out


def grid(last: int) -> list[int]:
    marks = [5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 400, 500, 600, 800, 1000]
    marks += [1500]
    marks += [2000, 3000, 4000, 5000, 7500, 10000, 15000, 20000]
    return [s for s in marks if s < last] + [last]


def run(args) -> None:
    x, y, z, model = problem(args.n, args.m)
    print(
        f"SVGP classification (probit), n = {args.n:,}, M = {args.m}, batch "
        f"{args.batch}, float64, {jax.devices()[0].platform}; adam(0.01) alone, or "
        + (
            "natural gradients at a rate halved every 100 steps from 0.2 to 0.005, "
            "adam from 0.05 to 0.002"
            if args.rate is None
            else f"natural gradients at rate {args.rate} with adam(0.01)"
        )
    )
    opts = optimisers(args.rate)
    steps = args.timing_steps
    calls = {
        f"eqxprob {name}": timed_scan(model, o, x, y, args.batch)
        for name, o in opts.items()
    }
    has_gpjax = importlib.util.find_spec("gpjax") is not None
    if has_gpjax:
        gp_call, gp_initial = timed_gpjax(x, y, z, args.batch, args.rate)
        calls["GPJax 1.0 fit_natgrads"] = gp_call
        ours = float(elbo(ep.resolve(model), x, y, args.n))
        print(f"initial full-data ELBO: eqxprob {ours:.6f}, GPJax {gp_initial:.6f}")
    for name, o in opts.items():
        calls[f"ep.fit {name}"] = timed_ep(model, o, x, y, args.batch)
    seconds = per_step(calls, steps, args.rounds)  # (all interleaved)
    base = seconds.get("GPJax 1.0 fit_natgrads")
    rows = [
        [name, f"{1e3 * s:.3f}", f"{s / base:.2f}" if base else "–"]
        for name, s in seconds.items()
    ]
    if not has_gpjax:
        rows.append(["GPJax 1.0 fit_natgrads", "not installed", "–"])
    print(
        f"\nper step, over {steps} steps (fastest of {args.rounds} rounds): in one "
        "compiled lax.scan, and through ep.fit (with its per-call trace and "
        "program look-up)"
    )
    print(table(["", "ms per step", "vs GPJax fit_natgrads"], rows))
    seconds = {name: seconds[f"eqxprob {name}"] for name in opts}
    if args.no_trace:
        return

    traces = {}
    limits = {"adam": args.adam_steps, "natural gradients + adam": args.natgrad_steps}
    for name, o in opts.items():
        marks = grid(limits[name])
        traces[name] = (marks, trace(model, o, x, y, args.batch, marks))
    best = max(max(values) for _, values in traces.values())
    target = best - 1e-3 * abs(best)
    print(f"\nfull-data ELBO: best {best:.2f}, target (within 0.1%) {target:.2f}")
    rows, reached = [], {}
    for name, (marks, values) in traces.items():
        hit = next((s for s, v in zip(marks, values) if v >= target), None)
        reached[name] = hit
        wall = "–" if hit is None else f"{hit * seconds[name]:.2f}"
        rows.append(
            [name, f"{max(values):.2f}", str(hit or f"not in {marks[-1]}"), wall]
        )
    print(table(["", "best ELBO", "steps to target", "wall s to target"], rows))
    a, g = reached["adam"], reached["natural gradients + adam"]
    if a and g:
        time_ratio = (g * seconds["natural gradients + adam"]) / (a * seconds["adam"])
        print(
            f"natural gradients + adam / adam: {g / a:.3f} of the steps, "
            f"{time_ratio:.3f} of the wall time"
        )
    print("\nELBO at the checkpoints")
    header = ["step", *traces]
    marks = sorted(set().union(*(m for m, _ in traces.values())))
    rows = [
        [str(s)]
        + [
            f"{dict(zip(*traces[name]))[s]:.2f}" if s in traces[name][0] else ""
            for name in traces
        ]
        for s in marks
    ]
    print(table(header, rows))
    if args.plot:
        plot(traces, seconds, best, args)
        print(f"wrote {args.plot}")


def plot(traces: dict, seconds: dict, best: float, args) -> None:
    """ELBO against steps and against seconds (steps × time per step), the two
    ways side by side: the how-to's figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for name, (marks, values) in traces.items():
        steps = np.asarray(marks)
        for ax, xs in zip(axes, (steps, steps * seconds[name])):
            ax.plot(xs, values, marker="o", markersize=3, label=name)
    low = min(min(v) for _, v in traces.values())
    for ax, label in zip(axes, ("steps", "seconds (steps × time per step, CPU)")):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.axhline(best - 1e-3 * abs(best), color="grey", lw=0.8, ls="--")
        ax.set_ylim(max(low, best - 0.05 * abs(best)), best + 0.005 * abs(best))
    axes[0].set_ylabel("full-data ELBO")
    axes[0].legend(loc="lower right")
    fig.suptitle(
        f"SVGP classification, n = {args.n:,}, M = {args.m}, batch {args.batch} "
        "(dashed: within 0.1% of the best)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CPU smoke sizes")
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="a constant natural-gradient rate (with adam(0.01)); default: decaying",
    )
    parser.add_argument("--adam-steps", type=int, default=5000)
    parser.add_argument("--natgrad-steps", type=int, default=1000)
    parser.add_argument("--timing-steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plot", help="write the figure (ELBO vs steps, seconds)")
    parser.add_argument(
        "--no-trace", action="store_true", help="the time per step only (table 1)"
    )
    args = parser.parse_args()
    if args.quick:
        args.n, args.m, args.batch = 2000, 16, 128
        args.adam_steps, args.natgrad_steps = 200, 50
        args.timing_steps, args.rounds = 200, 2
    run(args)
