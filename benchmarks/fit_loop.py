"""`ep.fit`'s loop per step against a hand-written `jax.jit(lax.scan)` of the same
step, on an accelerator or the CPU.

The hand-written baseline is `ep.fit`'s step written out: the same minibatch
draws (`randint(fold_in(k, step))`) and keys (`fold_in(k, step)`),
`jax.value_and_grad` and `optax.adam`, in one `lax.scan` of all the steps.
Problems: logistic regression (D = 64, batch 4096), mean-field VI of its weights
(`ep.guide`, `ep.elbo`), the SVGP example (M = 128, batch 1024) and the exact GP
example (float32). Each variant runs once to compile, then `--rounds` timed
calls of `--steps` steps, interleaved, with a call of `ep.fit` of one step: its
own cost (its trace and lowering at every call), which ep.fit's per step leaves
out. Per step and the ratio are medians over rounds of each round's own (in
brackets the ratio of the fastest calls); the whole call ratio is of the
fastest calls, the call's own cost included.

Run: `python benchmarks/fit_loop.py [--small] [--rounds R]`
"""

from __future__ import annotations

import argparse
import functools
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
    args = parser.parse_args()
    rows = []
    for name, model, loss, data, batch in problems(args.small):
        # (On the CPU, a call of the hand-written loop takes 3-6 s, so that a
        # call's own cost and noise are small beside it.)
        small_steps = 16000 if name.startswith(("logistic", "mean-field")) else 4000
        steps = args.steps or (
            small_steps if args.small else 200 if "exact" in name else 4000
        )
        kw = {} if data is None else {"data": data, "batch_size": batch}
        key = None if data is None else jax.random.key(2)
        optimiser = optax.adam(0.01)
        fit_kw = dict(optimiser=optimiser, progress=False, key=key, **kw)
        sides = {
            "hand": hand_written(model, loss, optimiser, steps, key=key, **kw),
            "fit": functools.partial(ep.fit, model, loss, steps=steps, **fit_kw),
            # (A call of one step: what a call of `ep.fit` costs besides its
            # steps, its trace and lowering above all.)
            "call": functools.partial(ep.fit, model, loss, steps=1, **fit_kw),
        }
        times = {side: [] for side in sides}
        for side in sides:
            _timed(sides[side])
        order = list(sides)
        for r in range(args.rounds):
            for side in order if r % 2 == 0 else order[::-1]:
                times[side].append(_timed(sides[side]))
        hand, fit, call = (np.array(times[side]) for side in sides)
        # Per step from each round's own calls (interleaved, so they share the
        # machine's state), the median over rounds: a slow spell moves one
        # round, not the estimate; and from the fastest calls, since a slow
        # spell only adds time.
        ratio = float(np.median((fit - call) / hand))
        fastest = (fit.min() - call.min()) / hand.min()
        rows.append(
            [
                name,
                f"{steps}",
                f"{np.median(hand) / steps * 1e3:.4f}",
                f"{np.median(fit - call) / steps * 1e3:.4f}",
                f"{ratio:.3f} ({fastest:.3f})",
                f"{np.median(call) * 1e3:.1f}",
                f"{fit.min() / hand.min():.3f}",
            ]
        )
    device = jax.devices()[0]
    print(
        f"ep.fit vs hand-written jit(lax.scan), ms per step (warm calls), "
        f"jax {jax.__version__}, {device.platform} {device.device_kind}"
    )
    header = ["problem", "steps", "hand ms/step", "ep.fit ms/step"]
    header += ["ratio (of the fastest calls)", "ep.fit per call ms"]
    header += ["whole call ratio"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
