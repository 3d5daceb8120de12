"""`FixedDistrax`: distrax, TFP-JAX and numpyro distributions and bijectors as proper
pytrees.

distrax's `Jittable`, TFP's JAX pytrees and numpyro's pytrees flatten into derived
caches, order their leaves unstably or carry unequal metadata, so `eqx.filter_grad`,
`eqx.partition`, `eqx.tree_at` and friends fail on them. Following the Equinox author's
advice, `FixedDistrax` holds the class and its constructor arguments instead, and
instantiates the object lazily at every method call. Its leaves are exactly the array
arguments it was given, each in a field named after its constructor parameter.

Everything specific to a library lives in `_families.py`; this module is
family-agnostic.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree
from tensorflow_probability.substrates import jax as tfp

from . import _families
from ._families import CONCRETE, Family, family_of, float_key, fresh, fresh_tree


tfd = tfp.distributions
tfb = tfp.bijectors


def _is_wrapper(x: Any) -> bool:
    return isinstance(x, FixedDistrax)


_PLAIN_ARRAYS = frozenset({CONCRETE, np.ndarray})  # concrete arrays


def _is_dynamic(x: Any) -> bool:
    """Leaves of a wrapper: arrays (jax or numpy) and nested wrappers."""
    # (Wrappers before `eqx.is_array`, whose `isinstance` of a Module is slow.)
    return type(x) in _PLAIN_ARRAYS or _is_wrapper(x) or eqx.is_array(x)


def _is_raw(x: Any) -> bool:
    return _families.is_raw(x)


def _is_dynamic_or_raw(x: Any) -> bool:
    return _is_dynamic(x) or _is_raw(x)


@functools.cache
def _family(cls: type) -> Family:
    family = family_of(cls)
    assert family is not None
    return family


@functools.cache
def _is_distribution_class(cls: type) -> bool:
    return _family(cls).is_distribution_class(cls)


@functools.cache
def _keyword_only_call(cls: type) -> bool:
    """Whether every argument can be passed by keyword (no `*args`, positional-only)."""
    kinds = {p.kind for p in _family(cls).signature(cls).parameters.values()}
    return not kinds & {
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    }


class _Const:
    """A static value inside a dynamic argument (e.g. an int in a list of wrappers).

    A pytree node without children whose auxiliary data is itself, so it never
    becomes a leaf and compares by value, as static fields do.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        self._key = float_key(value)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Const) and self._key == other._key

    def __repr__(self) -> str:
        return repr(self.value)


jtu.register_pytree_node(_Const, lambda c: ((), c), lambda c, _: c)


def _checks_anywhere(tree: Any) -> bool:
    """Whether a wrapper in `tree`, at any depth, checks values when built (as
    recorded for builds by `__init__`, else found)."""
    for x in jtu.tree_leaves(tree, is_leaf=_is_wrapper):
        if not _is_wrapper(x):
            continue
        hit = _checked_build(x)
        if hit is not None:
            if hit.checks:
                return True
            continue
        d = object.__getattribute__(x, "__dict__")
        cls, static = d["cls"], d["_static"]
        if _checks_values(cls, static) or _checks_anywhere(
            [d[n] for n in static.dynamic]
        ):
            return True
    return False


def _checks_values(cls: type, static: _Static) -> bool:
    """Whether building `cls` with these static arguments checks values."""
    return _family(cls).checks_values(cls, dict(static.static))


_INEXACT: dict[Any, bool] = {}  # dtype -> whether it is a float or complex dtype


# `_CHECKED_BUILDS`: by id, a mark of each wrapper built by its `__init__`.
# Plain: it holds no `ep.Bijector`/`ep.Frozen` to resolve. Values: its library
# checked its values (numpyro's validation on, TFP's `validate_args`), and they
# cannot change (no NumPy array). Checks: it or a wrapper inside it checks values
# when built, so it is built at every parent's check (never by the shapes-and-
# dtypes cache). Kept outside the instance, whose `__dict__` Equinox flattens
# into the treedef. A wrapper rebuilt from leaves (`tree_at`, `jax.jit`
# arguments, deserialising) has no mark.
class _Mark(weakref.ref):
    """A weak reference to a wrapper built by its `__init__`, with what is known
    of it (see `_CHECKED_BUILDS`)."""

    __slots__ = ("i", "plain", "values", "checks")

    def __init__(self, wrapper: Any, plain: bool, values: bool, checks: bool):
        super().__init__(wrapper, _forget)  # pyright: ignore[reportCallIssue]  (as the docs subclass `weakref.ref`)
        self.i = id(wrapper)
        self.plain, self.values, self.checks = plain, values, checks

    def __new__(cls, wrapper: Any, *_: Any) -> _Mark:
        return super().__new__(cls, wrapper, _forget)


def _forget(mark: _Mark) -> None:  # the wrapper is gone: its id may be reused
    if _CHECKED_BUILDS.get(mark.i) is mark:
        _CHECKED_BUILDS.pop(mark.i, None)


_CHECKED_BUILDS: dict[int, _Mark] = {}


def _mark_checked(
    wrapper: FixedDistrax, plain: bool, values: bool, checks: bool
) -> None:
    _CHECKED_BUILDS[id(wrapper)] = _Mark(wrapper, plain, values, checks)


def _plain_build(wrapper: FixedDistrax) -> bool:
    hit = _checked_build(wrapper)
    return hit is not None and hit.plain


def _is_module(x: Any) -> bool:
    return isinstance(x, eqx.Module)


def _is_plain(value: Any) -> bool:
    """Whether an argument holds no `ep.Bijector`/`ep.Frozen` node to resolve:
    only concrete arrays and wrappers marked plain when built (in a list, say)."""
    if type(value) in _PLAIN_ARRAYS:
        return True
    return all(
        type(x) in _PLAIN_ARRAYS or (_is_wrapper(x) and _plain_build(x))
        for x in jtu.tree_leaves(value, is_leaf=_is_module)
    )


def _checked_build(wrapper: FixedDistrax) -> _Mark | None:
    """The mark of `wrapper` if it was built by its `__init__`, else `None`."""
    hit = _CHECKED_BUILDS.get(id(wrapper))
    return hit if hit is not None and hit() is wrapper else None


# The module's caches (`_VALIDATED`, `_SEEN`, `_UNTRACEABLE`, `_CHECKED`,
# `_BINDINGS`) are bounded: each is simply emptied when full.
_CACHE_SIZE = 4096


def _room(cache: set | dict) -> None:
    """Make room for one more entry in a module cache (emptied when full)."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()


# Keys of builds that passed validation (see `_validation_key`).
_VALIDATED: set = set()


def _validation_key(cls: type, static: _Static, dynamic: dict[str, Any]) -> Any:
    """What a build's validity depends on, for a build that checks shapes and
    dtypes only: the class, the static arguments, and the structure, shapes and
    dtypes of the dynamic ones. `None` (validate every time) if an argument is an
    integer or bool array (shapes, counts and paddings are read as values, e.g. by
    `tfd.Sample` or `tfb.Reshape`), or if the key cannot be hashed."""
    leaves, treedef = jtu.tree_flatten(dynamic)
    shapes = []
    for x in leaves:
        if eqx.is_array(x):
            dtype = x.dtype
            inexact = _INEXACT.get(dtype)
            if inexact is None:
                inexact = _INEXACT[dtype] = bool(jnp.issubdtype(dtype, jnp.inexact))
            if not inexact:
                return None
            shapes.append((x.shape, dtype))
        else:
            shapes.append(x)
    key = (cls, static, treedef, tuple(shapes))
    try:
        hash(key)
    except TypeError:
        return None
    return key


# Keys of builds (see `_traced_key`) seen once, and of builds that failed to
# build under the trace of their check where the eager build passed (they need
# concrete values, or a distribution they hold overrides the library's check).
_SEEN: set = set()
_UNTRACEABLE: set = set()


class _Untraceable(Exception):
    """Building failed under the trace of `_traced_checks`."""


def _traced_key(cls: type, static: _Static, dynamic: dict[str, Any]) -> Any:
    """For a build whose family checks it under a trace: the key of its compiled
    check (`_traced_verdict`), if that may run. It may if the class, static
    arguments and nested wrappers' structure hash, were seen before (a build
    seen once is checked eagerly: static arguments made afresh per build, a
    `lambda` say, would compile a check per build), and did not fail to build
    under that trace before; and if every argument is a concrete JAX array (not
    traced, not NumPy) or a wrapper whose values were checked when built (or
    that checks none) and holds only concrete JAX arrays. `None` otherwise."""
    leaves, structure = jtu.tree_flatten(dynamic)
    if not all(type(x) is CONCRETE for x in leaves):
        return None
    nested = False
    for x in jtu.tree_leaves(list(dynamic.values()), is_leaf=_is_wrapper):
        if _is_wrapper(x):
            hit = _checked_build(x)
            if hit is None or (hit.checks and not hit.values):
                return None
            nested = True
    key = (cls, static, structure if nested else None)  # (None: hashes faster)
    try:
        if key in _UNTRACEABLE:
            return None
        if key not in _SEEN:
            _room(_SEEN)
            _SEEN.add(key)
            return None
    except TypeError:  # an unhashable static argument (a numpyro constraint)
        return None
    return key


def _traced_verdict(key: Any, dynamic: dict[str, Any]) -> bool | None:
    """The library's value check as one compiled call (~6 µs where numpyro's
    eager check takes ~60 µs): `True` if it passes; `None` if the build fails
    under its trace; `False` if it fails, or cannot run here (under an outer
    trace, arguments on several devices...). Unless `True`, the build is then
    checked eagerly, which raises the library's error."""
    try:
        result = _traced_checks(key, dynamic)
    except _Untraceable:
        return None
    except Exception:
        return False
    if isinstance(result, jax.core.Tracer):  # built inside a transformation
        return False
    return bool(np.all(np.asarray(result)))


@functools.partial(jax.jit, static_argnums=0)
def _traced_checks(key: tuple[type, _Static, Any], dynamic: dict[str, Any]) -> Any:
    cls, static, _ = key
    family = _family(cls)
    try:
        built = _build(_make(cls, static, dynamic), False)
        family.check_built(built)
        checks = family.traced_checks(built)
    except Exception as e:
        raise _Untraceable from e
    if checks is None:
        raise _Untraceable
    return checks


class _Static:
    """The static part of a wrapper: argument names, and the non-array arguments.

    Stored as a static field, so it hashes and compares by value: two wrappers
    built separately from equal arguments then share one compiled function. Values
    are compared together with their type, so `1`, `1.0` and `True` differ, and so
    do `0.0` and `-0.0`.
    """

    __slots__ = ("names", "dynamic", "static", "_key")

    def __init__(
        self, names: tuple[str, ...], static: tuple[tuple[str, Any], ...]
    ) -> None:
        self.names = names
        self.static = static
        static_names = {n for n, _ in static}
        self.dynamic = tuple(n for n in names if n not in static_names)
        self._key = (names, tuple((n, float_key(v)) for n, v in static))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key

    def __repr__(self) -> str:
        return f"_Static({', '.join(f'{n}={v!r}' for n, v in self.static)})"


_CHECKED: dict[type, Family] = {}  # classes that passed `_check_class`


def _check_class(cls: Any) -> Family:
    if isinstance(cls, type):
        family = _CHECKED.get(cls)
        if family is not None:
            return family
    family = family_of(cls)
    if family is None or not (
        family.is_distribution_class(cls) or family.is_bijector_class(cls)
    ):
        if _is_raw(cls):
            kind = f"an instance of {type(cls).__name__}"
        elif callable(cls) and getattr(cls, "__module__", "").startswith("numpyro."):
            kind = (
                f"{cls!r}, a numpyro factory function rather than a class (use the "
                "class it returns, e.g. `numpyro.distributions.CategoricalLogits` "
                "for `Categorical(logits=...)`)"
            )
        else:
            kind = repr(cls)
        raise TypeError(
            "FixedDistrax expects a distrax, TFP-JAX or numpyro distribution or "
            f"bijector class as its first argument, got {kind}. Pass the class and "
            "its constructor arguments, e.g. `FixedDistrax(distrax.Normal, loc, "
            "scale)`."
        )
    reason = family.abstract_reason(cls)
    if reason is not None:
        raise TypeError(
            f"FixedDistrax({cls.__name__}): {family.qualname(cls)} {reason}."
        )
    _room(_CHECKED)
    _CHECKED[cls] = family
    return family


# (class, number of positional arguments, keyword names) -> where each bound
# argument comes from (an index into the positional ones, or a keyword), in the
# signature's order: for classes without `*args`/`**kwargs`.
_BINDINGS: dict[tuple, tuple[tuple[str, Any], ...]] = {}


def _bind(family: Family, cls: type, args: tuple, kwargs: dict) -> dict[str, Any]:
    """`signature.bind(*args, **kwargs).arguments`, with the same errors; a call
    shape seen before is bound from the cache (~1 µs rather than ~6)."""
    key = (cls, len(args), tuple(kwargs))
    sources = _BINDINGS.get(key)
    if sources is not None:
        return {n: args[i] if type(i) is int else kwargs[i] for n, i in sources}
    signature = family.signature(cls)
    _check_keywords(family, cls, signature, kwargs)
    try:
        arguments = dict(signature.bind(*args, **kwargs).arguments)
    except TypeError as e:
        raise TypeError(f"FixedDistrax({cls.__name__}): {e}") from None
    parameters = signature.parameters
    if all(p.kind in _NAMED for p in parameters.values()):
        positional = list(parameters)[: len(args)]
        _room(_BINDINGS)
        _BINDINGS[key] = tuple(
            (n, positional.index(n) if n in positional else n) for n in arguments
        )
    return arguments


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _check_keywords(
    family: Family, cls: type, signature: inspect.Signature, kwargs: Mapping
) -> None:
    """Name an unknown keyword before `bind` reports a missing argument instead."""
    parameters = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    named = [
        n
        for n, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    for name in kwargs:
        if name not in named:
            raise TypeError(
                f"FixedDistrax({cls.__name__}): got an unexpected keyword argument "
                f"{name!r}; {family.qualname(cls)} takes {', '.join(named) or 'none'}."
            )


def _resolved(wrapper: FixedDistrax) -> FixedDistrax:
    """`wrapper` with any `ep.Bijector`/`ep.Frozen` node among its arguments
    resolved, for the construction-time check only: the wrapper keeps the nodes
    (resolve the model in the forward pass, as always)."""
    from ._parameter import resolve  # lazily: _parameter builds on this module

    return resolve(wrapper)


_PLAIN = frozenset({float, int, bool, str, type(None)})


def _check_argument(family: Family, cls: type, name: str, value: Any) -> None:
    """Reject constructor arguments that cannot live in a pytree."""
    if type(value) in _PLAIN:
        return
    where = f"FixedDistrax({cls.__name__}): argument `{name}`"
    for leaf in jtu.tree_leaves(value, is_leaf=_is_dynamic_or_raw):
        if _is_dynamic(leaf):
            continue
        if _is_raw(leaf):  # so it has a family
            qualname = _families.family_of_instance(leaf).qualname(type(leaf))  # pyright: ignore[reportOptionalMemberAccess]
            raise TypeError(
                f"{where} is a raw {qualname} instance, whose arrays would be hidden "
                f"from JAX. Wrap it too: `FixedDistrax({qualname}, ...)`."
            )
        try:
            hash(leaf)
        except TypeError:
            raise TypeError(
                f"{where} of type {type(leaf).__name__} is neither an array nor "
                "hashable, so it can be neither a leaf nor static. Pass it as a "
                "JAX/NumPy array, or as a hashable value."
            ) from None


def _default_float() -> Any:
    return jax.dtypes.canonicalize_dtype(np.float64)  # float32 unless x64 is on


def _floats_to_arrays(arguments: dict[str, Any], keep: frozenset) -> dict[str, Any]:
    """Python floats (outside the arguments `keep`) become arrays of the default
    float dtype, not weakly typed: all of them in one compiled call, ~4 µs for
    one and ~1.5 µs for each more, where `jnp.asarray` takes ~18 µs for each."""
    names = [n for n, v in arguments.items() if n not in keep and not _is_dynamic(v)]
    if not names:
        return arguments
    leaves, treedef = jtu.tree_flatten(
        [arguments[n] for n in names], is_leaf=_is_dynamic
    )
    where = [i for i, x in enumerate(leaves) if type(x) is float]
    if not where:
        return arguments
    arrays = _as_arrays(_default_float(), *(leaves[i] for i in where))
    for i, array in zip(where, arrays):
        leaves[i] = array
    return arguments | dict(zip(names, jtu.tree_unflatten(treedef, leaves)))


@functools.partial(jax.jit, static_argnums=0)
def _as_arrays(dtype: Any, *values: float) -> list[Array]:
    return [jnp.asarray(v, dtype) for v in values]


def _has_dynamic(value: Any) -> bool:
    return any(map(_is_dynamic, jtu.tree_leaves(value, is_leaf=_is_dynamic)))


def _hide_static(value: Any) -> Any:
    if _is_dynamic(value):
        return value
    return jtu.tree_map(
        lambda x: x if _is_dynamic(x) else _Const(x), value, is_leaf=_is_dynamic
    )


def _is_const_or_wrapper(x: Any) -> bool:
    return isinstance(x, (_Const, FixedDistrax))


def _show(value: Any) -> Any:
    """A dynamic field's value as given (static parts unhidden)."""
    if isinstance(value, (jax.Array, np.ndarray, FixedDistrax)):
        return value
    return jtu.tree_map(
        lambda x: x.value if isinstance(x, _Const) else x,
        value,
        is_leaf=_is_const_or_wrapper,
    )


_SUBCLASSES: dict[tuple[str, ...], type] = {}
_SUBCLASSES_LOCK = threading.Lock()


def _subclass(dynamic: tuple[str, ...]) -> type:
    """The `FixedDistrax` subclass whose fields are the dynamic arguments, by name.

    Equinox derives key paths from field names, so a field per argument makes
    `jax.tree_util.tree_flatten_with_path` show `.loc` rather than an index. One
    class per set of names, also when several threads ask at once (two classes
    would give equal wrappers unequal tree structures).
    """
    sub = _SUBCLASSES.get(dynamic)
    if sub is None:
        with _SUBCLASSES_LOCK:
            sub = _SUBCLASSES.get(dynamic)
            if sub is None:
                sub = _SUBCLASSES[dynamic] = _new_subclass(dynamic)
    return sub


def _new_subclass(dynamic: tuple[str, ...]) -> type:
    namespace = {
        "__annotations__": dict.fromkeys(dynamic, Any),
        "__module__": __name__,
        "__qualname__": "FixedDistrax",
        "__doc__": FixedDistrax.__doc__,
    }
    metaclass: type = type(FixedDistrax)  # Equinox's; pyright misreads the call
    return metaclass("FixedDistrax", (FixedDistrax,), namespace)


def _make(cls: type, static: _Static, dynamic: Mapping[str, Any]) -> FixedDistrax:
    """A wrapper from its parts, without calling or checking anything."""
    self = object.__new__(_subclass(static.dynamic))
    object.__setattr__(self, "cls", cls)
    object.__setattr__(self, "_static", static)
    for name in static.dynamic:
        object.__setattr__(self, name, dynamic[name])
    return self


class _CheapMethod:
    """A method whose bound form is a `jax.tree_util.Partial` (itself a PyTree).

    Equinox turns every bound method of a Module into a `BoundMethod` Module at
    each attribute access, which costs about 20 µs per eager call; a `Partial` is
    just as usable as a PyTree (e.g. passed through `jax.jit`) and costs 3 µs.
    """

    def __init__(self, function: Any):
        self.function = function
        # A descriptor, not a callable: update_wrapper copies the metadata all the same.
        functools.update_wrapper(self, function)  # pyright: ignore[reportArgumentType]

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self.function
        return jtu.Partial(self.function, instance)

    def __set_name__(self, owner: type, name: str) -> None:
        self.__name__ = name


_cheap_method = _CheapMethod


class FixedDistrax(eqx.Module):
    """A distrax, TFP-JAX or numpyro distribution or bijector as a proper PyTree.

    Holds the class (static) and its constructor arguments, and builds the
    underlying object afresh at every method call, which costs nothing after
    `jax.jit`. The leaves are exactly the array arguments, each in a field named
    after its constructor parameter, so `eqx.filter_grad`, `eqx.partition` /
    `eqx.combine`, `eqx.tree_at(lambda d: d.loc, ...)`, `jax.jit`, `jax.vmap`,
    `lax.scan`, serialisation and optax all work, and key paths read `.loc`.

    Arguments are split as follows:

    - arrays (JAX or NumPy) and nested `FixedDistrax` objects, also inside lists,
      tuples and dicts, are leaves;
    - **Python floats become arrays** of the default float dtype (float32, or
      float64 with `jax_enable_x64`), as distrax itself converts them: they are
      trained, saved and loaded like any parameter. The few arguments a class
      branches on in Python stay static floats (see the "supported families"
      page, e.g. `distrax.RationalQuadraticSpline`'s `range_min`);
    - everything else (Python ints, bools, strings, `None`, dtypes, callables) is
      static and compared by value and type, so an equal wrapper built separately
      does not recompile.

    Distributions forward `log_prob`, `prob`, `sample`, `sample_and_log_prob`,
    `mean`, `mode`, `variance`, `stddev`, `entropy`, `cdf`, `log_cdf`,
    `kl_divergence`, `cross_entropy`, `batch_shape`, `event_shape` (tuples) and
    `dtype`. Bijectors forward `forward`, `inverse`, `forward_and_log_det`,
    `inverse_and_log_det`, `forward_log_det_jacobian`, `inverse_log_det_jacobian`
    and `__call__` (= `forward`): one method set for distrax, TFP and numpyro
    alike (for numpyro, `mean` is a method as elsewhere and `sample` takes
    `seed=`). Any other attribute falls through to the instantiated object; a
    method of it that returns a raw distribution or bijector (numpyro's
    `to_event`, say) returns it wrapped. An array argument named `mean`
    (numpyro's `NegativeBinomial2`, `BetaProportion`) is a field like any other,
    so on such a wrapper `d.mean` is that array, as numpyro's `mean` property is,
    and `ep.FixedDistrax.mean(d)` calls the forwarded method. (Their objects
    keep no `mean`, so a method that returns one, `to_event` say, returns it
    raw.)

    Construction checks the arguments by building the object once. A build whose
    class, static arguments, shapes and dtypes equal those of an earlier valid
    build is not built again, except where building checks values: numpyro
    distributions (which validate by default), TFP with `validate_args=True`,
    and any build with integer array arguments (shapes and counts). A numpyro
    distribution is checked by numpyro's own test of its arguments (and of the
    distributions it builds from them), run as one compiled call per class and
    shapes from the second build of a class and static arguments on (the first
    build of new shapes compiles it); the object is built eagerly only to raise
    numpyro's error, or where the test cannot be traced.

    No call mutates process-wide state, so wrappers may be used from several
    threads at once (see `eqxprob/_families.py` on TFP's bijector cache).

    **Arguments:**

    - `cls`: a concrete distrax, TFP-JAX or numpyro distribution or bijector class.
    - `*args`, `**kwargs`: its constructor arguments.

    **Raises:**

    `TypeError` if `cls` is not such a class, a keyword is unknown, or an argument
    can be neither a leaf nor static; `TypeError`/`ValueError` naming the class if
    it rejects the arguments (checked by building it once at construction).

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    dist = ep.FixedDistrax(distrax.Normal, loc=jnp.zeros(3), scale=jnp.ones(3))
    grads = eqx.filter_grad(lambda d: d.log_prob(1.0).sum())(dist)
    print(grads.loc)  # [1. 1. 1.]
    ```
    """

    cls: type = eqx.field(static=True)
    _static: _Static = eqx.field(static=True)

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        family = _check_class(cls)
        arguments = _bind(family, cls, args, kwargs)
        for name, value in arguments.items():
            if not _is_dynamic(value):  # arrays and wrappers need no check
                _check_argument(family, cls, name, value)
        arguments = _floats_to_arrays(arguments, family.static_floats(cls))
        arguments = family.prepare(cls, arguments)
        dynamic = {
            n: v if _is_dynamic(v) else _hide_static(v)
            for n, v in arguments.items()
            if _is_dynamic(v) or _has_dynamic(v)
        }
        for name in dynamic:
            if name in _RESERVED:
                raise TypeError(
                    f"FixedDistrax({cls.__name__}): the array argument `{name}` has "
                    "the name of a FixedDistrax attribute, so it cannot be a field. "
                    "Please report this at the eqxprob issue tracker."
                )
        static = _Static(
            tuple(arguments),
            tuple((n, v) for n, v in arguments.items() if n not in dynamic),
        )
        # The instance becomes one of the subclass whose fields are the dynamic
        # arguments (same layout: a plain `__dict__`), before any field is set.
        object.__setattr__(self, "__class__", _subclass(static.dynamic))
        object.__setattr__(self, "cls", cls)
        object.__setattr__(self, "_static", static)
        for name, value in dynamic.items():
            object.__setattr__(self, name, value)
        # Plain: no `ep.Bijector` inside to resolve (as known of nested wrappers
        # checked when built, see `_CHECKED_BUILDS`).
        arrays_only = all(type(v) in _PLAIN_ARRAYS for v in dynamic.values())
        plain = arrays_only or all(map(_is_plain, dynamic.values()))
        # Whether the build checks values (its family's, or a nested wrapper's):
        # then it is built every time rather than cached by shapes and dtypes.
        checks = _checks_values(cls, static) or (
            not arrays_only and _checks_anywhere(dynamic)
        )
        key = None if checks else _validation_key(cls, static, dynamic)
        if key is not None and key in _VALIDATED:
            _mark_checked(self, plain, False, checks)
            return
        traced = (
            checks
            and plain
            and family.checks_traced(cls, dict(static.static))
            and _traced_key(cls, static, dynamic)
        )
        untraceable = False
        if traced:
            verdict = _traced_verdict(traced, dynamic)
            if verdict:
                _mark_checked(self, plain, True, checks)
                return
            untraceable = verdict is None
        try:
            target = self if plain else _resolved(self)
            built = _build(target, False, nested=True)
            family.check_built(built)
        except Exception as e:
            message = (
                f"FixedDistrax({cls.__name__}): {family.qualname(cls)} rejected the "
                f"arguments ({', '.join(_items(self.arguments))}): {e}"
            )
            if any(v is None or type(v) is int for v in arguments.values()):
                message += (
                    " (If this is meant as a prefix tree such as `jax.vmap`'s "
                    f"`in_axes`, build it with `FixedDistrax.spec({cls.__name__}, "
                    "...)`, which does not call the class.)"
                )
            error = type(e) if isinstance(e, (TypeError, ValueError)) else ValueError
            raise error(message) from e
        if key is not None:
            _room(_VALIDATED)
            _VALIDATED.add(key)
        if untraceable:  # the library builds eagerly what fails under a trace
            _room(_UNTRACEABLE)
            _UNTRACEABLE.add(traced)
        # Values checked for good only if they cannot change: no NumPy array.
        values = family.validated(built) and not any(
            isinstance(x, np.ndarray) for x in jtu.tree_leaves(dynamic)
        )
        _mark_checked(self, plain, values, checks)

    # --- structure without construction -----------------------------------

    @classmethod
    def spec(
        _cls,
        cls: type,
        *args: Any,
        static_arguments: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> FixedDistrax:
        """A prefix PyTree (e.g. `jax.vmap`'s `in_axes`) for wrappers of `cls`.

        Builds a `FixedDistrax` node with the structure of `FixedDistrax(cls, ...)`
        without calling `cls`: each argument given here holds the prefix value
        for that argument (an axis, `None`, a nested `spec`...). Give every
        argument the real wrapper has; those that are static there (ints, strings,
        bools such as `reinterpreted_batch_ndims=1`) go in `static_arguments`,
        with their real values.

        **Arguments:**

        - `cls`: the wrapped class.
        - `*args`, `**kwargs`: prefix values for its array arguments, by position
          or name.
        - `static_arguments`: the static arguments of the real wrapper.

        **Returns:**

        A `FixedDistrax` usable as a prefix of wrappers of `cls`.

        **Example:**

        ```python
        import distrax
        import jax
        import jax.numpy as jnp
        import eqxprob as ep

        dist = ep.FixedDistrax(distrax.Normal, jnp.arange(3.0), jnp.array(1.0))
        in_axes = ep.FixedDistrax.spec(distrax.Normal, 0, None)
        values = jax.vmap(lambda d: d.log_prob(0.0), in_axes=(in_axes,))(dist)
        assert values.shape == (3,)
        ```
        """
        family = _check_class(cls)
        signature = family.signature(cls)
        static_arguments = dict(static_arguments or {})
        _check_keywords(family, cls, signature, {**kwargs, **static_arguments})
        try:
            bound = signature.bind_partial(*args, **kwargs, **static_arguments)
        except TypeError as e:
            raise TypeError(f"FixedDistrax.spec({cls.__name__}): {e}") from None
        arguments = dict(bound.arguments)
        static = _Static(
            tuple(arguments),
            tuple((n, v) for n, v in arguments.items() if n in static_arguments),
        )
        return _make(cls, static, {n: arguments[n] for n in static.dynamic})

    # --- constructor arguments ---------------------------------------------

    @property
    def arguments(self) -> dict[str, Any]:
        """The constructor arguments by parameter name (nested wrappers kept)."""
        static = self._static
        values = dict(static.static)
        d = self.__dict__
        for name in static.dynamic:
            values[name] = _show(d[name])
        return {name: values[name] for name in static.names}

    @property
    def family(self) -> Family:
        """The adapter of the wrapped class's library (private API)."""
        return _family(self.cls)

    @_cheap_method
    def instantiate(self) -> Any:
        """Build the underlying distrax/TFP/numpyro object, unwrapping nested wrappers.

        **Example:**

        ```python
        import distrax
        import jax.numpy as jnp
        import eqxprob as ep

        raw = ep.FixedDistrax(distrax.Normal, jnp.array(0.0), jnp.array(1.0))
        assert isinstance(raw.instantiate(), distrax.Normal)
        ```
        """
        return _build(self, False)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: first the static constructor
        # arguments, then the built object.
        if name.startswith("__") or name in ("cls", "_static"):
            raise AttributeError(name)
        d = self.__dict__
        if "_static" not in d:
            raise AttributeError(name)
        for arg, value in d["_static"].static:
            if arg == name:
                if _probed_by_tree_at(self):
                    raise TypeError(_static_message(self, name, value))
                return value
        fresh_arrays = _caches(self)
        attribute = getattr(_build(self, fresh_arrays), name)
        if inspect.ismethod(attribute):
            return functools.partial(_call_through, attribute, fresh_arrays)
        return attribute

    def __repr__(self) -> str:
        return (
            f"FixedDistrax({', '.join([self.cls.__name__, *_items(self.arguments)])})"
        )

    def __pdoc__(self, **kwargs: Any) -> wl.AbstractDoc:
        """`Normal(loc=f32[3], scale=f32[3])` inside `eqx.tree_pformat` & co."""
        return wl.bracketed(
            begin=wl.TextDoc(f"{self.cls.__name__}("),
            docs=wl.named_objs(self.arguments.items(), **kwargs),
            sep=wl.comma,
            end=wl.TextDoc(")"),
            indent=kwargs.get("indent", 2),
        )

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """`Normal(loc=..., scale=...)` in treescope (its optional protocol; the
        import happens only when treescope itself calls this)."""
        from treescope import repr_lib

        return repr_lib.render_object_constructor(
            object_type=self.cls,
            attributes=self.arguments,
            path=path,
            subtree_renderer=subtree_renderer,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        dynamic = {n: self.__dict__[n] for n in self._static.dynamic}
        return _make, (self.cls, self._static, dynamic)

    @property
    def is_distribution(self) -> bool:
        """Whether the wrapped class is a distribution (else a bijector)."""
        return _is_distribution_class(self.cls)

    # --- distributions --------------------------------------------------------

    @_cheap_method
    def log_prob(self, value: PyTree[ArrayLike]) -> Float[Array, "*batch"]:
        """Log density (or mass) of `value`."""
        return _call(self, True, "log_prob", _unwrap(value))

    @_cheap_method
    def prob(self, value: PyTree[ArrayLike]) -> Float[Array, "*batch"]:
        """Density (or mass) of `value`."""
        return _call(self, True, "prob", _unwrap(value))

    @_cheap_method
    def cdf(self, value: ArrayLike) -> Float[Array, "*batch"]:
        """Cumulative distribution function at `value`."""
        return _call(self, True, "cdf", value)

    @_cheap_method
    def log_cdf(self, value: ArrayLike) -> Float[Array, "*batch"]:
        """Log of the cumulative distribution function at `value`."""
        return _call(self, True, "log_cdf", value)

    @_cheap_method
    def sample(
        self, *, seed: PRNGKeyArray | int, sample_shape: int | Sequence[int] = ()
    ) -> PyTree[Array]:
        """Draw samples of shape `sample_shape + batch_shape + event_shape`."""
        return _call_keyed(self, "sample", seed, sample_shape)

    @_cheap_method
    def sample_and_log_prob(
        self, *, seed: PRNGKeyArray | int, sample_shape: int | Sequence[int] = ()
    ) -> tuple[PyTree[Array], Float[Array, "*batch"]]:
        """Draw samples and return `(samples, log_prob(samples))`."""
        return _call_keyed(self, "sample_and_log_prob", seed, sample_shape)

    @_cheap_method
    def mean(self) -> PyTree[Array]:
        """The mean."""
        return _call(self, True, "mean")

    @_cheap_method
    def mode(self) -> PyTree[Array]:
        """The mode."""
        return _call(self, True, "mode")

    @_cheap_method
    def variance(self) -> PyTree[Array]:
        """The variance."""
        return _call(self, True, "variance")

    @_cheap_method
    def stddev(self) -> PyTree[Array]:
        """The standard deviation."""
        return _call(self, True, "stddev")

    @_cheap_method
    def entropy(self) -> Float[Array, "*batch"]:
        """The (differential) entropy."""
        return _call(self, True, "entropy")

    @_cheap_method
    def kl_divergence(self, other: Any) -> Float[Array, "*batch"]:
        """KL(self || other); `other` may be wrapped or raw."""
        return _call(self, True, "kl_divergence", other)

    @_cheap_method
    def cross_entropy(self, other: Any) -> Float[Array, "*batch"]:
        """Cross entropy of `other` relative to self; `other` may be wrapped."""
        return _call(self, True, "cross_entropy", other)

    @property
    def batch_shape(self) -> Any:
        """The batch shape, as a tuple for every family."""
        return _get(self, "batch_shape")

    @property
    def event_shape(self) -> Any:
        """The event shape, as a tuple for every family."""
        return _get(self, "event_shape")

    @property
    def dtype(self) -> Any:
        """The dtype of samples."""
        return _get(self, "dtype")

    # --- bijectors ------------------------------------------------------------

    @_cheap_method
    def forward(self, x: ArrayLike) -> Array:
        """y = f(x)."""
        return _call(self, False, "forward", x)

    @_cheap_method
    def inverse(self, y: ArrayLike) -> Array:
        """x = f⁻¹(y)."""
        return _call(self, False, "inverse", y)

    @_cheap_method
    def forward_log_det_jacobian(self, x: ArrayLike) -> Float[Array, "*shape"]:
        """log|det J(f)(x)| (elementwise for scalar bijectors)."""
        return _call(self, False, "forward_log_det_jacobian", x)

    @_cheap_method
    def inverse_log_det_jacobian(self, y: ArrayLike) -> Float[Array, "*shape"]:
        """log|det J(f⁻¹)(y)| (elementwise for scalar bijectors)."""
        return _call(self, False, "inverse_log_det_jacobian", y)

    @_cheap_method
    def forward_and_log_det(self, x: ArrayLike) -> tuple[Array, Float[Array, "*shape"]]:
        """`(f(x), log|det J(f)(x)|)`, for every family."""
        return _call(self, False, "forward_and_log_det", x)

    @_cheap_method
    def inverse_and_log_det(self, y: ArrayLike) -> tuple[Array, Float[Array, "*shape"]]:
        """`(f⁻¹(y), log|det J(f⁻¹)(y)|)`, for every family."""
        return _call(self, False, "inverse_and_log_det", y)

    def __call__(self, x: ArrayLike) -> Array:
        """Same as `forward`."""
        return _call(self, False, "forward", x)


# Names an array argument's field may not take: the wrapper's own attributes.
# Except `mean`, which numpyro's `NegativeBinomial2` and `BetaProportion` take as
# an array: the field shadows the forwarded method on such a wrapper (`d.mean` is
# the argument, as numpyro's `mean` property is; `FixedDistrax.mean(d)` calls the
# method), since eqxprob's own code calls no wrapper's `mean`.
_RESERVED = (frozenset(dir(FixedDistrax)) | {"family"}) - {"mean"}


# Module-level rather than methods: Equinox wraps every bound method of a Module
# in a Module of its own, which costs microseconds per eager call.


def _probed_by_tree_at(wrapper: FixedDistrax) -> bool:
    """Whether `eqx.tree_at` is calling its `where` on `wrapper` (its leaves are then
    Equinox's private `equinox._tree._LeafWrapper`s; pinned by a test)."""
    return any(
        type(x).__name__ == "_LeafWrapper" and type(x).__module__ == "equinox._tree"
        for x in jtu.tree_leaves(wrapper)
    )


def _static_message(wrapper: FixedDistrax, name: str, value: Any) -> str:
    family = _family(wrapper.cls)
    what = f"FixedDistrax({wrapper.cls.__name__}): the argument `{name}` = {value!r}"
    if type(value) is float:
        why = (
            f"is a static Python float ({family.qualname(wrapper.cls)} branches on "
            "it in Python, so it is not converted to an array leaf)"
        )
        fix = (
            "Build a new wrapper with the new value. (Other Python floats are "
            "leaves already; to make a value trainable elsewhere, pass it as "
            "`jnp.asarray(...)`.)"
        )
    else:
        why = f"is static (a {type(value).__name__}, part of the structure)"
        fix = (
            "Build a new wrapper with the new value, or pass an array, e.g. "
            "`jnp.asarray(...)`, if it is a parameter."
        )
    return f"{what} {why}, not a leaf, so `eqx.tree_at` cannot replace it. {fix}"


def _caches(wrapper: FixedDistrax) -> bool:
    """Whether `wrapper` builds any object of a family that caches by identity."""
    if _family(wrapper.cls).caches_by_identity:
        return True
    d = wrapper.__dict__
    for name in wrapper._static.dynamic:
        value = d[name]
        if isinstance(value, jax.Array):
            continue
        for leaf in jtu.tree_leaves(value, is_leaf=_is_wrapper):
            if _is_wrapper(leaf) and _caches(leaf):
                return True
    return False


def _build(wrapper: FixedDistrax, fresh_arrays: bool, nested: bool = False) -> Any:
    """Instantiate `wrapper`; with `fresh_arrays`, every array is a fresh reference.
    With `nested`, the nested wrappers that were checked when built (not those
    rebuilt from leaves, by `tree_at` or a transformation) are built without
    their library's value checks: to check `wrapper` itself once."""
    d = object.__getattribute__(wrapper, "__dict__")  # (Module attributes are slow)
    static, cls = d["_static"], d["cls"]
    values = dict(static.static)
    hit = _checked_build(wrapper) if nested else None
    extra = _family(cls).unchecked(cls) if hit is not None and hit.values else {}
    for name in static.dynamic:
        value = d[name]
        if isinstance(value, FixedDistrax):
            value = _build(value, fresh_arrays, nested)
        elif isinstance(value, jax.Array):
            if fresh_arrays:
                value = fresh(value)
        elif not isinstance(value, np.ndarray):
            value = jtu.tree_map(
                lambda x: (
                    _build(x, fresh_arrays, nested)
                    if isinstance(x, FixedDistrax)
                    else x.value
                    if isinstance(x, _Const)
                    else fresh(x)
                    if fresh_arrays
                    else x
                ),
                value,
                is_leaf=_is_const_or_wrapper,
            )
        values[name] = value
    values |= extra
    if _keyword_only_call(cls):
        return cls(**values)
    ordered = {name: values[name] for name in static.names} | extra
    bound = inspect.BoundArguments(_family(cls).signature(cls), ordered)
    return cls(*bound.args, **bound.kwargs)


def _check_kind(wrapper: FixedDistrax, distribution: bool, method: str) -> None:
    if _is_distribution_class(wrapper.cls) != distribution:
        kind, other = (
            ("bijector", "distribution")
            if distribution
            else ("distribution", "bijector")
        )
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}) wraps a {kind}; `{method}` is "
            f"only available on a wrapped {other}."
        )


def _call(wrapper: FixedDistrax, distribution: bool, method: str, *args: Any) -> Any:
    """Instantiate `wrapper` and call the uniform `method` on the result."""
    _check_kind(wrapper, distribution, method)
    fresh_arrays = _caches(wrapper)
    obj = _build(wrapper, fresh_arrays)
    if fresh_arrays:
        args = tuple(_build(a, True) if _is_wrapper(a) else fresh_tree(a) for a in args)
    else:
        args = tuple(_build(a, False) if _is_wrapper(a) else a for a in args)
    return _family(wrapper.cls).call(obj, method, *args)


def _call_keyed(wrapper: FixedDistrax, method: str, seed: Any, shape: Any) -> Any:
    _check_kind(wrapper, True, method)
    obj = _build(wrapper, _caches(wrapper))
    return _family(wrapper.cls).call(obj, method, seed=seed, sample_shape=shape)


def _get(wrapper: FixedDistrax, name: str) -> Any:
    """Instantiate a wrapped distribution and read its property `name`."""
    _check_kind(wrapper, True, name)
    obj = _build(wrapper, _caches(wrapper))
    return _family(wrapper.cls).get(obj, name)


def _call_through(method: Any, fresh_arrays: bool, *args: Any, **kwargs: Any) -> Any:
    """Call a fallen-through method; wrap a raw distribution or bijector it returns."""
    if fresh_arrays:
        args, kwargs = fresh_tree((args, kwargs))
    out = method(*args, **kwargs)
    if _is_raw(out):
        try:
            return _families.wrap_instance(out)
        except TypeError:
            return out
    return out


def _unwrap(x: Any) -> Any:
    """Instantiate `x` if it is a wrapper (recursively through its arguments)."""
    return x.instantiate() if _is_wrapper(x) else x


def _format(value: Any) -> str:
    class _Raw:
        def __init__(self, text: str):
            self.text = text

        def __repr__(self) -> str:
            return self.text

    value = jtu.tree_map(
        lambda x: _Raw(repr(x)) if _is_wrapper(x) else x, value, is_leaf=_is_wrapper
    )
    return eqx.tree_pformat(value, short_arrays=True, width=10_000)


def _items(arguments: Mapping[str, Any]) -> list[str]:
    """`name=value` for each argument, arrays shown as `f32[3]`."""
    return [f"{name}={_format(value)}" for name, value in arguments.items()]
