"""Shared measuring tools for the benchmark scripts (not a test; asserts nothing)."""

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


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


def hlo_op_count(fn: Callable[..., Any], *args: Any) -> int:
    """Number of instructions in the optimised, compiled HLO of `jax.jit(fn)`."""
    return count_hlo_ops(jax.jit(fn).lower(*args).compile().as_text())


def count_hlo_ops(hlo: str, loop_body: bool = False) -> int:
    """Instructions in compiled HLO text: all of them, or (`loop_body=True`) those
    of the one `while` loop's body and the computations it calls, i.e. one step of
    a `lax.scan`, without the code around the loop."""
    computations: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        header = re.match(r"(?:ENTRY )?%(\S+) .*\{$", line)
        if header:
            name = header.group(1)
            computations[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None and " = " in line:
            computations[name].append(line)
    if not loop_body:
        return sum(len(lines) for lines in computations.values())
    loops = [
        re.search(r"body=%([\w.\-]+)", line).group(1)
        for lines in computations.values()
        for line in lines
        if " while(" in line
    ]
    if len(loops) != 1:
        raise ValueError(f"expected one while loop in the HLO, found {len(loops)}")
    seen, stack = set(), loops
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            for line in computations[name]:
                stack += [
                    c for c in re.findall(r"%([\w.\-]+)", line) if c in computations
                ]
    return sum(len(computations[c]) for c in seen)


def table(header: list[str], rows: list[list[Any]]) -> str:
    """Format a plain-text table with right-aligned columns."""
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
