"""Shared measuring tools for the benchmark scripts (not a test; asserts nothing)."""

import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax


# One HLO counter and one hand-written SVGP, kept with the tests that use them
# (tests/_hlo.py, tests/_hand_svgp.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import _hand_svgp as hand_svgp  # noqa: E402, F401  (the SVGP maths by hand)
from _hlo import count_hlo_ops, hlo_op_count  # noqa: E402, F401


def median_seconds(fn: Callable[[], Any], repeat: int = 50, number: int = 1) -> float:
    """Median wall time of `fn()` over `repeat` runs (after one warm-up call)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def table(header: list[str], rows: list[list[Any]]) -> str:
    """Format a plain-text table with right-aligned columns."""
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
