"""The metadata registry's cost: tree builders eagerly, and nothing after `jit`.

A model whose one `ep.field(constraint=positive)` annotates a list of N scalar
parameters (N = 10, 1,000, 10,000). Prints the eager time of `bijector_tree`,
`unconstrain` and `constrain`, and the compiled HLO instruction count of a jitted
`constrain` + loss against the same loss hand-written on raw arrays with
`jax.nn.softplus` (target: equal).

Run: `python benchmarks/registry.py`
"""

import time

import equinox as eqx
import jax
import jax.numpy as jnp
from _common import hlo_op_count, table

import eqxprob as ep


class Model(eqx.Module):
    scales: list = ep.field(constraint=ep.constraints.positive)


def _seconds(fn, repeat=1):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    rows = []
    for n in (10, 1_000, 10_000):
        model = Model([jnp.asarray(1.0 + i / n) for i in range(n)])
        raw = ep.unconstrain(model)

        def loss(raw):
            return jnp.sum(jnp.stack(ep.constrain(raw).scales) ** 2)

        def hand(us):
            return jnp.sum(jnp.stack([jax.nn.softplus(u) for u in us]) ** 2)

        ops = hlo_op_count(loss, raw) if n <= 1_000 else None
        hand_ops = hlo_op_count(hand, raw.scales) if n <= 1_000 else None
        print(f"n = {n} done", flush=True)
        rows.append(
            [
                n,
                f"{_seconds(lambda m=model: ep.bijector_tree(m)) * 1e3:.1f}",
                f"{_seconds(lambda m=model: ep.unconstrain(m)) * 1e3:.1f}",
                f"{_seconds(lambda r=raw: ep.constrain(r)) * 1e3:.1f}",
                "-" if ops is None else ops,
                "-" if hand_ops is None else hand_ops,
                "-" if ops is None else ("yes" if ops == hand_ops else "NO"),
            ]
        )
    header = [
        "annotated leaves",
        "bijector_tree ms",
        "unconstrain ms",
        "constrain ms",
        "HLO ops constrain+loss",
        "HLO ops hand-written",
        "equal",
    ]
    print(table(header, rows))
    print("(HLO counts skipped at 10,000 leaves: compiling 10,000 scalars is slow.)")


if __name__ == "__main__":
    main()
