"""Static values compared by structure, so that equal functions share compilations.

`jax.jit` caches a compiled program per static argument, compared with `==`. A
function compares by identity, so `ep.fit(..., optimiser=optax.adam(1e-3))` called
twice, or with a fresh `lambda`, would compile twice although nothing differs.
`Keyed(x)` compares by a structural key instead: a function by its code, defaults,
closure values and the globals it reads (recursively, to a small depth); small
arrays by value; large arrays, and anything unhashable, by identity (the key holds
a reference, so an identity is never reused for another object).

Two values with equal keys compute the same thing, so serving one's compiled
program for the other is exact. What falls back to identity only costs a compile.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import jax
import numpy as np


_SMALL = 1024  # arrays up to this many elements are keyed by value
_DEPTH = 32  # deep enough for optax schedules built from schedules


class _Same:
    """Compares by identity, and keeps its object alive."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _Same(cell)


def key(x: Any, depth: int = 0) -> Any:
    """A hashable structural key of `x`."""
    if depth > _DEPTH:
        return _Same(x)
    nxt = depth + 1
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return (type(x), x)
    if isinstance(x, (type, types.ModuleType, types.BuiltinFunctionType, np.dtype)):
        return _Same(x) if not _hashable(x) else ("id", x)
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(key(v, nxt) for v in x))
    if isinstance(x, dict):
        return (type(x), tuple((key(k, nxt), key(v, nxt)) for k, v in x.items()))
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if isinstance(x, jax.core.Tracer):
            return _Same(x)
        if np.size(x) <= _SMALL:
            a = np.asarray(x)
            return ("array", a.shape, a.dtype.str, a.tobytes())
        return _Same(x)
    if isinstance(x, types.FunctionType):
        code = x.__code__
        cells = tuple(key(_cell(c), nxt) for c in x.__closure__ or ())
        globals_ = tuple(
            (name, key(x.__globals__[name], nxt))
            for name in code.co_names
            if name in x.__globals__
        )
        return (
            "function",
            code,
            key(x.__defaults__, nxt),
            key(x.__kwdefaults__, nxt),
            cells,
            globals_,
        )
    if isinstance(x, types.MethodType):
        return ("method", key(x.__func__, nxt), key(x.__self__, nxt))
    if isinstance(x, functools.partial):
        return ("partial", key(x.func, nxt), key(x.args, nxt), key(x.keywords, nxt))
    if _hashable(x):
        return ("value", type(x), x)
    return _Same(x)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


class Keyed:
    """`value`, hashed and compared by `key(value)`: a static argument for `jit`."""

    __slots__ = ("value", "_key", "_hash")

    def __init__(self, value: Any):
        self.value = value
        self._key = key(value)
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyed) and self._key == other._key
