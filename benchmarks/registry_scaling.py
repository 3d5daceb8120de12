"""How the eager registry operations scale with the number of leaves L.

A model whose one `ep.field(constraint=positive, prior=Gamma)` annotates a list of L
scalar parameters (L = 10, 100, 1000, 5000). For each operation, the median time
over interleaved rounds (order rotated each round) as a ratio to a hand-written
per-leaf loop on a dict of the same arrays, measured in the same run, with the
range over rounds; each call with the garbage collector off, as in `timeit`.
Asserts nothing.

Run: `OPENBLAS_NUM_THREADS=1 python benchmarks/registry_scaling.py [--rounds 5]`
"""

from __future__ import annotations

import argparse
import gc
import time

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import paramax
from _common import table

import eqxprob as ep


GAMMA = distrax.Gamma(2.0, 1.0)


class Model(eqx.Module):
    xs: list = ep.field(constraint=ep.constraints.positive, prior=GAMMA)


def _softplus(u):
    return jax.nn.softplus(u)


def operations(L: int) -> dict[str, tuple]:
    """name -> (eqxprob call, hand-written baseline[, paramax's equivalent])."""
    values = [jnp.asarray(1.0 + i / L) for i in range(L)]
    model = Model(values)
    raw = ep.unconstrain(model)
    params = ep.parameterize(model)
    hand_raw = {i: jnp.log(jnp.expm1(v)) for i, v in enumerate(values)}
    wrapped = [paramax.Parameterize(_softplus, u) for u in hand_raw.values()]
    raw_mask, params_mask = ep.trainable(raw), ep.trainable(params)
    return {
        "parameterize": (
            lambda: ep.parameterize(model),
            lambda: {i: jnp.log(jnp.expm1(v)) for i, v in enumerate(values)},
            lambda: [
                paramax.Parameterize(_softplus, jnp.log(jnp.expm1(v))) for v in values
            ],
        ),
        "unconstrain": (
            lambda: ep.unconstrain(model),
            lambda: {i: jnp.log(jnp.expm1(v)) for i, v in enumerate(values)},
        ),
        "constrain": (
            lambda: ep.constrain(raw),
            lambda: {i: jax.nn.softplus(u) for i, u in hand_raw.items()},
        ),
        "log_prior": (
            lambda: ep.log_prior(model),
            lambda: sum(GAMMA.log_prob(v) for v in values),
        ),
        "resolve": (
            lambda: ep.resolve(params),
            lambda: {i: jax.nn.softplus(u) for i, u in hand_raw.items()},
            lambda: paramax.unwrap(wrapped),
        ),
        # The baselines of these eight filter the same tree by hand: `raw` (plain
        # arrays) or `params` (one `ep.Bijector` node per leaf).
        "trainable (raw model)": (
            lambda: ep.trainable(raw),
            lambda: jax.tree_util.tree_map(eqx.is_inexact_array, raw),
        ),
        "trainable + partition (raw model)": (
            lambda: eqx.partition(raw, ep.trainable(raw)),
            lambda: eqx.partition(raw, eqx.is_inexact_array),
        ),
        "ep.partition (raw model)": (
            lambda: ep.partition(raw),
            lambda: eqx.partition(raw, eqx.is_inexact_array),
        ),
        # Equinox's step alone, with the bool tree computed beforehand: the floor
        # of `eqx.partition(m, ep.trainable(m))` whatever `trainable` costs.
        "eqx.partition, precomputed bool tree (raw model)": (
            lambda: eqx.partition(raw, raw_mask),
            lambda: eqx.partition(raw, eqx.is_inexact_array),
        ),
        "trainable (nodes)": (
            lambda: ep.trainable(params),
            lambda: jax.tree_util.tree_map(eqx.is_inexact_array, params),
        ),
        "trainable + partition (nodes)": (
            lambda: eqx.partition(params, ep.trainable(params)),
            lambda: eqx.partition(params, eqx.is_inexact_array),
        ),
        "ep.partition (nodes)": (
            lambda: ep.partition(params),
            lambda: eqx.partition(params, eqx.is_inexact_array),
        ),
        "eqx.partition, precomputed bool tree (nodes)": (
            lambda: eqx.partition(params, params_mask),
            lambda: eqx.partition(params, eqx.is_inexact_array),
        ),
    }


def _seconds(fn) -> float:
    """One call, with the garbage collector off as `timeit` has it: with
    thousands of nodes alive, a collection landing in one side's call would
    decide the ratio (seen: 0.2-2.7 for the same call)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        jax.block_until_ready(jax.tree_util.tree_leaves(fn()))
        return time.perf_counter() - start
    finally:
        gc.enable()


def main(rounds: int = 5, sizes=(10, 100, 1000, 5000)) -> None:
    rows = []
    for L in sizes:
        ops = operations(L)
        for fns in ops.values():  # warm up: compile
            for fn in fns:
                _seconds(fn)
        ratios = {name: [] for name in ops}
        paramax_ratios = {name: [] for name in ops}
        per_leaf = {name: [] for name in ops}
        names = list(ops)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                ours, hand, *others = ops[name]
                # Each side runs first in every other round: a call pays for
                # freeing the arrays the call before it returned.
                if r % 2:
                    t_ours, t_hand = _seconds(ours), _seconds(hand)
                else:
                    t_hand, t_ours = _seconds(hand), _seconds(ours)
                ratios[name].append(t_ours / t_hand)
                per_leaf[name].append(t_ours / L * 1e6)
                for other in others:
                    paramax_ratios[name].append(_seconds(other) / t_hand)
        for name in names:
            rows.append(
                [
                    L,
                    name,
                    f"{np.median(ratios[name]):.2f}",
                    f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f}",
                    f"{np.median(paramax_ratios[name]):.2f}"
                    if paramax_ratios[name]
                    else "-",
                    f"{np.median(per_leaf[name]):.1f}",
                ]
            )
    print(
        f"Eager registry operations vs a hand-written per-leaf loop, {rounds} "
        "interleaved rounds (OPENBLAS_NUM_THREADS as set); paramax's equivalent "
        "against the same baseline"
    )
    header = ["L", "operation", "ratio (median)", "range", "paramax", "µs per leaf"]
    print(table(header, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="L = 10 and 100 only")
    args = parser.parse_args()
    main(args.rounds, (10, 100) if args.quick else (10, 100, 1000, 5000))
