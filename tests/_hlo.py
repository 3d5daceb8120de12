"""Counting instructions in compiled HLO: the deterministic proxy of "no overhead
after `jit`" that tests compare with hand-written JAX (never wall time).

The benchmark scripts use the same counter (`benchmarks/_common.py` imports it).
"""

import re
from collections.abc import Callable
from typing import Any

import jax


def hlo_op_count(fn: Callable[..., Any], *args: Any) -> int:
    """Number of instructions in the optimised, compiled HLO of `jax.jit(fn)`."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert text is not None  # (None only where the backend cannot print HLO)
    return count_hlo_ops(text)


def count_hlo_ops(hlo: str, loop_body: bool = False) -> int:
    """Instructions in compiled HLO text: all of them, or (`loop_body=True`) those
    of the one `while` loop's body and the computations it calls, i.e. one step of
    a `lax.scan`, without the code around the loop."""
    computations = _computations(hlo)
    if not loop_body:
        return sum(len(lines) for lines in computations.values())
    loops = [
        body.group(1)
        for lines in computations.values()
        for line in lines
        if " while(" in line and (body := re.search(r"body=%([\w.\-]+)", line))
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


def _computations(hlo: str) -> dict[str, list[str]]:
    """Compiled HLO text's computations: name to instruction lines."""
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
    return computations


def trip_counts_around(hlo: str, opcode: str) -> list[int | None]:
    """The `while` loops of compiled HLO text whose body runs an `opcode`
    instruction (itself or through the computations it calls), each as its trip
    count if XLA knows it at compile time (`known_trip_count`), else None."""
    computations = _computations(hlo)

    def runs(name: str, seen: set[str]) -> bool:
        if name in seen:
            return False
        seen.add(name)
        return any(
            f" {opcode}(" in line
            or any(runs(c, seen) for c in re.findall(r"%([\w.\-]+)", line)
                   if c in computations)
            for line in computations[name]
        )  # fmt: skip

    counts: list[int | None] = []
    for lines in computations.values():
        for line in lines:
            body = re.search(r" while\(.*body=%([\w.\-]+)", line)
            if body and runs(body.group(1), set()):
                known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                counts.append(int(known.group(1)) if known else None)
    return counts
