"""Static values compared by structure, so that equal functions share compilations.

`jax.jit` caches a compiled program per static argument, compared with `==`. A
function compares by identity, so `ep.fit(..., optimiser=optax.adam(1e-3))` called
twice, or with a fresh `lambda`, would compile twice although nothing differs.
`Keyed(x)` compares by a structural key instead: a function by its code, defaults,
closure values and the globals it reads (recursively, to a small depth; the
modules and globals of the libraries in `_LIBRARIES` are taken as constant); an
`eqx.Module` by its fields, and a library's pure-Python object (`optax.MultiSteps`)
by its attributes; small arrays by value; large arrays, and anything unhashable, by
identity (the key holds a reference, so an identity is never reused for another
object).

Two values with equal keys compute the same thing, so serving one's compiled
program for the other is exact. What falls back to identity only costs a compile.
`remembered(x)` reuses a key while nothing it was computed from can have changed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import struct
import threading
import types
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
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


class _Walk(threading.local):
    """The state of one top-level `key` in this thread: the functions keyed so
    far (id -> (function, its key), or `None` while it is being keyed), and
    whether the key holds a tracer."""

    seen: dict | None = None
    traced: bool = False


_WALK = _Walk()


def _top(x: Any, depth: int, names: frozenset[str]) -> tuple[Any, bool]:
    """`key(x)` and whether it holds a tracer (a value of an outer `jax.vmap` or
    `jax.jit`, never met again)."""
    _WALK.seen, _WALK.traced = {}, False
    try:
        return _key(x, depth, names), _WALK.traced
    finally:
        _WALK.seen = None


def key(x: Any, depth: int = 0, names: frozenset[str] = frozenset()) -> Any:
    """A hashable structural key of `x`; `names` are the attribute names the
    code that refers to `x` reads (see `_attributes`).

    Within one top-level call, a function is keyed once: functions (and callable
    objects, through their `__call__`) that read each other through globals or
    cells would otherwise be walked once per path, exponentially many, and one
    met again while it is being keyed is keyed by identity (a cycle)."""
    if _WALK.seen is None:
        return _top(x, depth, names)[0]
    return _key(x, depth, names)


def _key(x: Any, depth: int, names: frozenset[str]) -> Any:
    if depth > _DEPTH:
        return _Same(x)
    nxt = depth + 1
    # Floats and complex numbers by their bits: 0.0 == -0.0 compute differently
    # (`arctan2`), and a NaN, unequal to itself, would make a new key (a compile)
    # at every call. (A subclass's own attributes count too.)
    if isinstance(x, (float, complex)):
        bits = struct.pack("<dd", x.real, x.imag)
        return (type(x), bits, _attributes(x, names, nxt) if _dict(x) else ())
    if x is None or isinstance(x, (bool, int, str, bytes)):
        return (type(x), x)
    if isinstance(x, types.ModuleType):
        if _library(x):  # its data is constant, as a library function's
            return ("module", _Same(x))  # globals are
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
            _WALK.traced = True
            return _Same(x)
        if x.size <= _SMALL:
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # (no NumPy
                a = np.asarray(jax.random.key_data(x))  # form: by its key data)
                return ("key", x.dtype, a.shape, a.dtype, a.tobytes())
            a = np.asarray(x)  # (weakly typed or not: `int8 * 2` differs)
            return ("array", a.shape, a.dtype, x.weak_type, a.tobytes())
        return _Same(x)  # JAX arrays are immutable: identity is exact
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)  # mutable in place: always by content
        digest = hashlib.blake2b(np.ascontiguousarray(a).tobytes()).digest()
        return ("numpy", a.shape, a.dtype, digest)
    if isinstance(x, types.FunctionType):
        return _once(x, lambda: _function(x, nxt))
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
    code = None
    if isinstance(call, types.FunctionType):  # a callable object: its globals
        code = key(call, nxt)
    # What the code that uses `x` reads of it, and what the code of its class may
    # when that is the user's (a `__call__` reading `self.t` through a helper
    # method); a library's objects are keyed whole below (fields, attributes).
    if not _library(type(x)):
        names = names | _class_names(type(x))
    if isinstance(x, eqx.Module):
        # Immutable, and every field known: by its fields' keys (floats by their
        # bits, arrays as above), not by identity or `==`, so an equal Module
        # made afresh for each call compiles nothing; and, as for any object, by
        # what the code reads of it (properties, class attributes).
        fields = tuple(
            (f.name, key(getattr(x, f.name), nxt, names)) for f in dataclasses.fields(x)
        )
        return ("module", type(x), code, fields, _attributes(x, names, nxt))
    if _hashable(x) and not _dict(x):
        return ("value", type(x), x, code)
    if _hashable(x) and type(x).__eq__ is not object.__eq__:  # (dataclasses)
        return ("value", type(x), x, code, _attributes(x, names, nxt))
    if _plain_library_object(x):
        # A library's object held whole in its `__dict__` (`optax.MultiSteps`):
        # its class's code is constant, so what it computes is fixed by its
        # attributes, keyed all (functions included) like a library function's
        # closure, so an equal one made afresh compiles nothing.
        return _once(
            x,
            lambda: ("library object", type(x), code, key(vars(x), nxt, names)),
            names,  # (the user's objects it holds are keyed by what is read)
        )
    return ("object", _Same(x), code, _attributes(x, names, nxt))


def _once(x: Any, make: Callable[[], Any], names: frozenset[str] | None = None) -> Any:
    """`make()`, the key of `x`, computed once per top-level key (and per set of
    `names` read of it, where the key depends on them): objects that refer to
    each other (functions through globals or cells, a library object's
    attributes) would otherwise be walked once per path, exponentially many; one
    met again while it is being keyed is keyed by identity (a cycle)."""
    seen = _WALK.seen
    assert seen is not None  # (set by the top-level `key`)
    at = (id(x), names)
    found = seen.get(at, _MISSING)
    if found is None:  # met again while being keyed: a cycle
        return ("cycle", _Same(x))
    if found is not _MISSING:  # met again: the number of its first meeting, so
        return ("again", found[1])  # that hashing and comparing keys is linear too
    seen[at] = None
    number = len(seen)  # (the order of first meetings: fixed by the structure)
    made = make()
    seen[at] = (x, number)  # (holds `x`: its id is not reused meanwhile)
    return made


@functools.lru_cache(maxsize=1024)
def _class_names(cls: type) -> frozenset[str]:
    """Every name the code of `cls` may read: its functions, properties,
    static and class methods, through its bases but `object`."""
    found: set[str] = set()
    for k in cls.__mro__[:-1]:
        for v in vars(k).values():
            if isinstance(v, property):
                v = v.fget
            elif isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            if isinstance(v, types.FunctionType):
                found |= _names(v.__code__)
    return frozenset(found)


def _plain_library_object(x: Any) -> bool:
    """Whether `x` is an instance of a library's pure-Python class whose whole
    state is its `__dict__`."""
    return _plain_library_class(type(x)) and _dict(x)


@functools.lru_cache(maxsize=1024)
def _plain_library_class(cls: type) -> bool:
    """A library's class with no `__new__` of its own (C types, `jax.jit`'s
    functions, arrays and shardings hold state beyond their `__dict__`) and no
    `__slots__`; fixed per class, so asked once."""
    return (
        _library(cls)
        and cls.__new__ is object.__new__
        and not any(k.__dict__.get("__slots__") for k in cls.__mro__)
    )


def _function(x: types.FunctionType, nxt: int) -> tuple:
    """The key of a function: its code, defaults, closure values and globals."""
    code = x.__code__
    read = _names(code)
    cells = tuple(key(_cell(c), nxt, read) for c in x.__closure__ or ())
    # A library's module globals are taken as constant (its closures, e.g.
    # optax's hyperparameters, still count); the user's are compared.
    library = _library(x)
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


def _dict(x: Any) -> bool:
    """Whether `x` has attributes of its own (a `__dict__`)."""
    return hasattr(x, "__dict__")


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


class Keyed:
    """`value`, hashed and compared by `key(value)`: a static argument for `jit`."""

    __slots__ = ("value", "_key", "_hash", "traced")

    def __init__(self, value: Any):
        self.value = value
        # (`traced`: the key holds a tracer, a closure over a value of an outer
        # `jax.vmap`/`jax.jit`, so it is never equal to a later one.)
        self._key, self.traced = _top(value, 0, frozenset())
        self._hash = hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyed) and self._key == other._key


_IMMUTABLE = (  # values fixed for life
    type(None), bool, int, float, complex, str, bytes, np.dtype, type, types.CodeType
)  # fmt: skip
_MISSING = object()  # a global name the code reads that is not defined


def _library(x: Any) -> bool:
    """Whether the module `x`, or the module `x` was defined in, is a library's."""
    name = x.__name__ if isinstance(x, types.ModuleType) else x.__module__
    return (name or "").split(".")[0] in _LIBRARIES


def frozen(x: Any, depth: int = 0) -> bool:
    """Whether `x` is made of immutable values, library modules and library
    functions whose closures and defaults are frozen too: then `key(x)` is fixed
    for as long as `x` is the same object."""
    if depth > _DEPTH:
        return False
    if isinstance(x, _IMMUTABLE) and (isinstance(x, type) or not _dict(x)):
        return True  # (a float subclass's attributes can change)
    if x is _MISSING:
        return True
    if isinstance(x, jax.Array):
        return not isinstance(x, jax.core.Tracer)
    if isinstance(x, types.ModuleType):
        return _library(x)
    if isinstance(x, tuple):  # NamedTuples included: optax's transformations
        return all(frozen(v, depth + 1) for v in x)
    if isinstance(x, types.FunctionType):
        if not _library(x):
            return False
        values = _reads(x, ())
        return values is not None and all(frozen(v, depth + 1) for v in values)
    if isinstance(x, functools.partial):
        # (Not with keywords: `x.keywords` is a dict, changed in place while `x`
        # stays the same object.)
        return not x.keywords and frozen((x.func, x.args), depth + 1)
    return False


def _reads(fn: types.FunctionType, names: tuple[str, ...]) -> tuple | None:
    """What `key(fn)` reads of `fn` that can be rebound while `fn` stays the
    same object: its code and module name, its defaults (keyword-only ones as
    names and values: they are a dict), the contents of its closure cells and
    the globals `names`. `None` with an empty cell."""
    try:
        cells = [c.cell_contents for c in fn.__closure__ or ()]
    except ValueError:  # an empty cell
        return None
    scope, kwdefaults = fn.__globals__, fn.__kwdefaults__ or {}
    return (
        fn.__code__,
        fn.__module__,
        fn.__defaults__,
        *kwdefaults,
        *kwdefaults.values(),
        *cells,
        *[scope.get(name, _MISSING) for name in names],
    )


# id -> (value, the global names its key reads, what it read, their ids, Keyed)
_REMEMBERED: dict[int, tuple[Any, tuple, tuple, tuple, Keyed]] = {}
_REMEMBER_SIZE = 256


def remembered(value: Any) -> Keyed:
    """`Keyed(value)`, reused while nothing `key(value)` reads can have changed:
    for a value that is `frozen` (`optax.adam(1e-3)`, chains, schedules of
    library code), for as long as it is the same object; for a function of the
    user's whose closure cells, defaults and the globals it reads are frozen
    values (arrays, numbers, library modules and functions: `lambda m:
    ep.resolve(m).nlml(x, y)` with `x` and `y` arrays), for as long as each of
    those is the same object as before: a rebound global, cell or default makes
    a fresh key. Anything else (a loss calling a function of the user's, an
    object's attributes) is keyed afresh at every call. Saves ~5-40 µs a call."""
    hit = _REMEMBERED.get(id(value))
    if hit is not None and hit[0] is value:
        if not hit[2]:
            return hit[4]
        now = _reads(value, hit[1])
        if now is not None and tuple(map(id, now)) == hit[3]:
            return hit[4]
    keyed = Keyed(value)
    names: tuple[str, ...] = ()
    if isinstance(value, types.FunctionType) and not _library(value):
        names = tuple(sorted(_names(value.__code__)))
        read = _reads(value, names)
        if read is None or not all(map(frozen, read)):
            return keyed
    elif frozen(value):
        read = ()
    else:
        return keyed
    if len(_REMEMBERED) >= _REMEMBER_SIZE:
        _REMEMBERED.clear()
    # (Holding the value and what it read keeps their ids from being reused.)
    _REMEMBERED[id(value)] = (value, names, read, tuple(map(id, read)), keyed)
    return keyed
