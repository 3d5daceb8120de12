"""`ep.fit`'s loop per step against a hand-written `jax.jit(lax.scan)` of the same
step, on an accelerator or the CPU.

The hand-written baseline is `ep.fit`'s step written out: the same minibatch
draws (`randint(fold_in(k, step))`) and keys (`fold_in(k, step)`),
`jax.value_and_grad` and `optax.adam`, in one `lax.scan` of all the steps.
Problems: logistic regression (D = 64, batch 4096), mean-field VI of its weights
(`ep.guide`, `ep.elbo`), the SVGP example (M = 128, batch 1024) and the exact GP
example (float32). Each variant runs once to compile, then `--rounds` timed
calls of S and of 2S steps, interleaved. Per step is what the S more steps add
to a call (both calls of `ep.fit` compile the same set of programs), from the
median calls (in brackets, from the fastest calls); `ep.fit`'s per call is
what remains of its call of S steps (its trace and lowerings at every call);
the whole call ratio is of the fastest calls of 2S.

Run: `python benchmarks/fit_loop.py [--small] [--rounds R] [--only mean-field]`
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
    parser.add_argument("--only", default="", help="problems whose name starts so")
    args = parser.parse_args()
    rows = []
    for name, model, loss, data, batch in problems(args.small):
        if not name.startswith(args.only):
            continue
        # (On the CPU, a call of 2S hand-written steps takes 2-5 s, so that noise
        # is small beside the S steps that the two calls differ by.)
        small_steps = 8000 if name.startswith(("logistic", "mean-field")) else 2000
        steps = args.steps or (
            small_steps if args.small else 100 if "exact" in name else 2000
        )
        kw = {} if data is None else {"data": data, "batch_size": batch}
        key = None if data is None else jax.random.key(2)
        optimiser = optax.adam(0.01)
        fit_kw = dict(optimiser=optimiser, progress=False, key=key, **kw)
        sides = {
            (side, n): hand_written(model, loss, optimiser, n, key=key, **kw)
            if side == "hand"
            else functools.partial(ep.fit, model, loss, steps=n, **fit_kw)
            for side in ("hand", "fit")
            for n in (steps, 2 * steps)
        }
        times = {side: [] for side in sides}
        for side in sides:
            _timed(sides[side])
        order = list(sides)
        for r in range(args.rounds):
            for side in order if r % 2 == 0 else order[::-1]:
                times[side].append(_timed(sides[side]))
        # Per step: what S more steps add to a call, from the median calls (a
        # slow spell moves one round, not the median) and from the fastest
        # (a slow spell only adds time). Both calls of `ep.fit` compile the
        # same programs (two steps, a chunk, the rest), so the difference is the
        # steps' own time, its chunks' host round trips included; what remains
        # of a call is its own cost (its trace and lowerings).
        med = {side: float(np.median(v)) for side, v in times.items()}
        low = {side: float(np.min(v)) for side, v in times.items()}
        hand = (med["hand", 2 * steps] - med["hand", steps]) / steps
        fit = (med["fit", 2 * steps] - med["fit", steps]) / steps
        fastest = (low["fit", 2 * steps] - low["fit", steps]) / (
            low["hand", 2 * steps] - low["hand", steps]
        )
        own = med["fit", steps] - fit * steps
        rows.append(
            [
                name,
                f"{steps} / {2 * steps}",
                f"{hand * 1e3:.4f}",
                f"{fit * 1e3:.4f}",
                f"{fit / hand:.3f} ({fastest:.3f})",
                f"{own * 1e3:.0f}",
                f"{low['fit', 2 * steps] / low['hand', 2 * steps]:.3f}",
            ]
        )
    device = jax.devices()[0]
    print(
        f"ep.fit vs hand-written jit(lax.scan), ms per step (warm calls), "
        f"jax {jax.__version__}, {device.platform} {device.device_kind}"
    )
    header = ["problem", "steps S / 2S", "hand ms/step", "ep.fit ms/step"]
    header += ["ratio (of the fastest calls)", "ep.fit per call ms"]
    header += ["whole call ratio (2S)"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
