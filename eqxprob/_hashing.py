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
import hashlib
import types
from typing import Any

import jax
import jax.core
import numpy as np


_SMALL = 1024  # JAX arrays up to this many elements are keyed by value
_LIBRARIES = frozenset(
    {"jax", "jaxlib", "numpy", "scipy", "equinox", "optax", "distrax", "chex"}
    | {"tensorflow_probability", "numpyro", "eqxprob", "functools", "builtins"}
)
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


@functools.lru_cache(maxsize=4096)
def _names(code: types.CodeType) -> frozenset[str]:
    """Every name `code` may load or read as an attribute, nested code objects
    (comprehensions, lambdas, inner functions) included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return frozenset(names)


def _attributes(x: Any, names: frozenset[str], depth: int) -> tuple:
    """The values of the attributes of `x` whose names the code reads: an object
    or module a function uses is compared by identity *and* by what it reads of
    it, so changing `config.t` between two calls is seen."""
    found = []
    for name in sorted(names):
        try:
            value = (
                object.__getattribute__(x, name)
                if not isinstance(x, types.ModuleType)
                else getattr(x, name)
            )
        except AttributeError:
            continue
        if isinstance(
            value, (types.FunctionType, types.MethodType, type, types.ModuleType)
        ) or callable(value):
            continue  # code, not data: fixed by the object's identity
        found.append((name, key(value, depth, names)))
    return tuple(found)


def key(x: Any, depth: int = 0, names: frozenset[str] = frozenset()) -> Any:
    """A hashable structural key of `x`; `names` are the attribute names the
    code that refers to `x` reads (see `_attributes`)."""
    if depth > _DEPTH:
        return _Same(x)
    nxt = depth + 1
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return (type(x), x)
    if isinstance(x, types.ModuleType):
        return ("module", _Same(x), _attributes(x, names, nxt))
    if isinstance(x, (type, types.BuiltinFunctionType, np.dtype)):
        return _Same(x) if not _hashable(x) else ("id", x)
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(key(v, nxt, names) for v in x))
    if isinstance(x, dict):
        return (
            type(x),
            tuple((key(k, nxt), key(v, nxt, names)) for k, v in x.items()),
        )
    if isinstance(x, jax.Array):
        if isinstance(x, jax.core.Tracer):
            return _Same(x)
        if np.size(x) <= _SMALL:
            a = np.asarray(x)
            return ("array", a.shape, a.dtype.str, a.tobytes())
        return _Same(x)  # JAX arrays are immutable: identity is exact
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)  # mutable in place: always by content
        digest = hashlib.blake2b(np.ascontiguousarray(a).tobytes()).digest()
        return ("numpy", a.shape, a.dtype.str, digest)
    if isinstance(x, types.FunctionType):
        code = x.__code__
        read = _names(code)
        cells = tuple(key(_cell(c), nxt, read) for c in x.__closure__ or ())
        # A library's module globals are taken as constant (its closures, e.g.
        # optax's hyperparameters, still count); the user's are compared.
        library = (x.__module__ or "").split(".")[0] in _LIBRARIES
        globals_ = tuple(
            (name, key(x.__globals__[name], nxt, read))
            for name in sorted(read)
            if not library and name in x.__globals__
        )
        return (
            "function",
            code,
            key(x.__defaults__, nxt, read),
            key(x.__kwdefaults__, nxt, read),
            cells,
            globals_,
        )
    if isinstance(x, types.MethodType):
        function = key(x.__func__, nxt)
        read = _names(x.__func__.__code__) if hasattr(x.__func__, "__code__") else names
        return ("method", function, key(x.__self__, nxt, read))
    if isinstance(x, functools.partial):
        return (
            "partial",
            key(x.func, nxt),
            key(x.args, nxt, names),
            key(x.keywords, nxt, names),
        )
    call = next(
        (k.__dict__["__call__"] for k in type(x).__mro__ if "__call__" in k.__dict__),
        None,
    )
    if isinstance(call, types.FunctionType):  # a callable object: its code reads
        names = names | _names(call.__code__)
    if _hashable(x) and not hasattr(x, "__dict__"):
        return ("value", type(x), x)
    if _hashable(x) and type(x).__eq__ is not object.__eq__:
        return ("value", type(x), x, _attributes(x, names, nxt))  # e.g. Modules
    return ("object", _Same(x), _attributes(x, names, nxt))


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
