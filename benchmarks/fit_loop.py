"""`ep.fit`'s loop per step against a hand-written `jax.jit(lax.scan)` of the same
step, on an accelerator or the CPU.

The hand-written baseline is `ep.fit`'s step written out: the same minibatch
draws (`randint(fold_in(k, step))`) and keys (`fold_in(k, step)`),
`jax.value_and_grad` and `optax.adam`, in one `lax.scan` of all the steps.
Problems: logistic regression (D = 64, batch 4096), mean-field VI of its weights
(`ep.guide`, `ep.elbo`), the SVGP example (M = 128, batch 1024) and the exact GP
example (float32). Each variant runs once to compile, then `--rounds` timed
calls, interleaved, at `--steps` and twice as many; per step is the difference
over the extra steps, the median over rounds of each round's own (as is the
ratio; in brackets the ratio of the fastest calls' differences), per call what
the fastest calls leave (for `ep.fit`, its trace and lowering at every call),
and the whole call ratio is at `--steps`.

`--dynamic` runs `ep.fit` with one step per block (`steps_per_block=1`, a
dynamic trip count, as on the CPU), to measure what the static blocks of 32
steps save on an accelerator.

Run: `python benchmarks/fit_loop.py [--small] [--rounds R] [--dynamic]`
"""

from __future__ import annotations

import argparse
import inspect
import pathlib
import sys
import time

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import table


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import gp_regression  # noqa: E402
import svgp_classification as svgp  # noqa: E402

import eqxprob as ep  # noqa: E402


def hand_written(model, loss, optimiser, steps, data=None, batch_size=None, key=None):
    """`ep.fit`'s steps in one `jax.jit(lax.scan)`: `run() -> (params, losses)`."""
    params, static = eqx.partition(model, ep.trainable(model))
    keys = None if key is None else jax.random.split(key)
    rows = None if data is None else jax.tree.leaves(data)[0].shape[0]

    def value(p, i):
        args = [eqx.combine(p, static)]
        if data is not None:
            batch = data
            if batch_size is not None:
                index = jax.random.randint(
                    jax.random.fold_in(keys[0], i), (batch_size,), 0, rows
                )
                batch = jax.tree.map(lambda d: d[index], data)
            args.append(batch)
        if key is None or "key" not in inspect.signature(loss).parameters:
            return loss(*args)
        return loss(*args, key=jax.random.fold_in(keys[1], i))

    @jax.jit
    def run(params):
        def body(carry, i):
            p, s = carry
            v, g = jax.value_and_grad(value)(p, i)
            u, s = optimiser.update(g, s, p)
            return (optax.apply_updates(p, u), s), v

        state = optimiser.init(params)
        steps_ = jnp.arange(steps, dtype=jnp.int32)
        (p, _), losses = jax.lax.scan(body, (params, state), steps_)
        return p, losses

    return lambda: run(params)


def logistic(n: int, d: int):
    kx, kw, ky = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (n, d))
    w = jax.random.normal(kw, (d,))
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ w)).astype(x.dtype)

    def loss(m, batch):
        xb, yb = batch
        logits = xb @ m["w"] + m["b"]
        return jnp.mean(jax.nn.softplus(logits) - yb * logits)

    model = {"w": jnp.zeros(d), "b": jnp.zeros(())}
    return model, loss, (x, y)


class Weights(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))


def problems(small: bool):
    n = 20_000 if small else 1_000_000
    model, loss, data = logistic(n, 64)
    yield "logistic regression, D=64, batch 4096", model, loss, data, 4096

    def negative_elbo(guide, batch, key):
        xb, yb = batch
        loglik = lambda m: (
            n
            / xb.shape[0]
            * jnp.sum(  # noqa: E731
                yb * (xb @ m.w) - jax.nn.softplus(xb @ m.w)
            )
        )
        return -ep.elbo(guide, loglik, key)

    guide = ep.guide(Weights(jnp.zeros(64)))
    yield "mean-field VI (ep.guide, ep.elbo), D=64, batch 4096", guide, \
        negative_elbo, data, 4096  # fmt: skip
    x, y = svgp.make_data(n, jax.random.key(1))
    m = 32 if small else 128
    yield (
        f"SVGP, M={m}, batch 1024",
        svgp.SVGP.init(x[:m]),
        svgp.make_loss(n),
        (x, y),
        1024,
    )
    n_gp = 256 if small else 4096
    x, y = gp_regression.make_data(n_gp)
    yield (
        f"exact GP, n={n_gp}, float32",
        ep.parameterize(gp_regression.initial_model()),
        lambda mdl: ep.resolve(mdl).nlml(x, y),
        None,
        None,
    )


def _timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CPU-sized problems")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="ep.fit with one step per block (a dynamic trip count), to measure "
        "what the static blocks save on an accelerator",
    )
    args = parser.parse_args()
    rows = []
    for name, model, loss, data, batch in problems(args.small):
        # (On the CPU, S steps of the hand-written loop take 1.5-3 s, so that
        # the difference of two calls is not the noise of one.)
        small_steps = 8000 if name.startswith(("logistic", "mean-field")) else 2000
        steps = args.steps or (
            small_steps if args.small else 100 if "exact" in name else 2000
        )
        kw = {} if data is None else {"data": data, "batch_size": batch}
        key = None if data is None else jax.random.key(2)
        optimiser = optax.adam(0.01)
        # Each side at `steps` and `2 * steps`: the difference is `steps` steps
        # without the per-call costs (for `ep.fit`, its trace).
        sides = {}
        for n in (steps, 2 * steps):
            sides["hand", n] = hand_written(model, loss, optimiser, n, key=key, **kw)
            fit_kw = dict(optimiser=optimiser, steps=n, progress=False, key=key, **kw)
            if args.dynamic:
                fit_kw["steps_per_block"] = 1
            sides["fit", n] = lambda model=model, loss=loss, fit_kw=fit_kw: ep.fit(
                model, loss, **fit_kw
            )
        times = {side: [] for side in sides}
        for side in sides:
            _timed(sides[side])
        order = list(sides)
        for r in range(args.rounds):
            for side in order if r % 2 == 0 else order[::-1]:
                times[side].append(_timed(sides[side]))
        t = {side: min(v) for side, v in times.items()}
        # Per step from each round's own four calls (interleaved, so they share
        # the machine's state), the median over rounds: a slow spell moves one
        # round, not the estimate.
        slopes = {
            s: [(b - a) / steps for a, b in zip(times[s, steps], times[s, 2 * steps])]
            for s in ("hand", "fit")
        }
        per_step = {s: float(np.median(slopes[s])) for s in ("hand", "fit")}
        ratio = float(np.median([f / h for h, f in zip(slopes["hand"], slopes["fit"])]))
        # (And from the fastest call of each: a slow spell only adds time.)
        fastest = {s: (t[s, 2 * steps] - t[s, steps]) / steps for s in ("hand", "fit")}
        per_call = {s: t[s, steps] - steps * per_step[s] for s in ("hand", "fit")}
        h, f = per_step["hand"], per_step["fit"]
        rows.append(
            [
                name,
                f"{steps}, {2 * steps}",
                f"{h * 1e3:.4f}",
                f"{f * 1e3:.4f}",
                f"{ratio:.3f} ({fastest['fit'] / fastest['hand']:.3f})",
                f"{per_call['hand'] * 1e3:.1f}",
                f"{per_call['fit'] * 1e3:.1f}",
                f"{t['fit', steps] / t['hand', steps]:.3f}",
            ]
        )
    device = jax.devices()[0]
    print(
        f"ep.fit vs hand-written jit(lax.scan), ms per step (warm calls), "
        f"jax {jax.__version__}, {device.platform} {device.device_kind}"
    )
    header = ["problem", "steps", "hand ms/step", "ep.fit ms/step"]
    header += ["ratio (of the fastest calls)"]
    header += ["hand per call ms", "ep.fit per call ms", "whole call ratio"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
