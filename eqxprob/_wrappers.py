"""`FixedDistrax`: a distrax, TFP-JAX or numpyro object as a proper PyTree.

distrax's `Jittable`, TFP's JAX pytrees and numpyro's pytrees flatten into derived
caches, order their leaves unstably or carry unequal metadata, so `eqx.filter_grad`,
`eqx.partition`, `eqx.tree_at` and friends fail on them. Following the Equinox author's
advice, `FixedDistrax` holds the class and its constructor arguments instead, and
instantiates the object at every method call. Its leaves are exactly the array
arguments it was given, each in a field named after its constructor parameter.

Everything specific to a library lives in `_families.py`; this module is
family-agnostic. **Where to add a forwarded method:** one method below, calling
`_call` (a family whose spelling differs maps it in its adapter's `call`).

Relies on Equinox reading fields from `__dict__` and naming key paths after them:
an instance belongs to a subclass made per set of array-argument names (pinned by
tests). `eqx.tree_at` probes `where` with leaves wrapped in Equinox's private
`_LeafWrapper`, recognised only to explain why a static argument cannot be
replaced.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import threading
from collections.abc import Container, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl
from tensorflow_probability.substrates import jax as tfp

from . import _attributes, _families
from ._families import Family, family_of, family_of_instance, is_raw
from ._node import resolve


tfb = tfp.bijectors


def _is_wrapper(x: Any) -> bool:
    return isinstance(x, FixedDistrax)


def _is_dynamic(x: Any) -> bool:
    """Leaves of a wrapper: arrays (jax or numpy) and nested wrappers."""
    return _is_wrapper(x) or eqx.is_array(x)


def _family(cls: type) -> Family:
    family = family_of(cls)
    assert family is not None
    return family


def _qualname(cls: type) -> str:
    return _family(cls).qualname(cls)


def float_key(value: Any) -> Any:
    """A hashable key that tells apart what `==` confuses: `1`, `1.0`, `True`,
    `0.0` and `-0.0`; NaN equals NaN. A raw library object (a distrax bijector
    held as a transform) is keyed by its class and attributes (unhashable if it
    holds arrays)."""
    if type(value) is float:
        return (float, value.hex() if not math.isnan(value) else "nan")
    if type(value) in (tuple, list):
        return (type(value), tuple(map(float_key, value)))
    if type(value) is dict:
        return (dict, tuple((k, float_key(v)) for k, v in value.items()))
    if is_raw(value):
        return (type(value), float_key(vars(value)))
    return (type(value), value)


class Const:
    """A value compared and hashed by `key` (default `float_key(value)`), as a
    static field needs: a static value inside a dynamic argument (e.g. an int in a
    list of wrappers), a static transform.

    A pytree node without children whose auxiliary data is itself, so it never
    becomes a leaf.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any, key: Any = None):
        self.value = value
        self._key = float_key(value) if key is None else key

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key == other._key  # pyright: ignore[reportAttributeAccessIssue]

    def __repr__(self) -> str:
        return repr(self.value)


jtu.register_pytree_node(Const, lambda c: ((), c), lambda c, _: c)


class _Static(Const):
    """The static part of a wrapper: argument names, and the non-array arguments.

    Stored as a static field, so it hashes and compares by value: two wrappers
    built separately from equal arguments then share one compiled function. Values
    are compared together with their type, so `1`, `1.0` and `True` differ, and so
    do `0.0` and `-0.0`.
    """

    __slots__ = ("names", "dynamic", "static")

    def __init__(self, arguments: Mapping[str, Any], dynamic: Container[str]) -> None:
        self.names = tuple(arguments)
        self.dynamic = tuple(n for n in arguments if n in dynamic)
        self.static = tuple((n, v) for n, v in arguments.items() if n not in dynamic)
        super().__init__(self.static, (self.names, float_key(self.static)))

    def __repr__(self) -> str:
        return f"_Static({', '.join(f'{n}={v!r}' for n, v in self.static)})"


def _check_class(cls: Any) -> Family:
    family = family_of(cls)
    if family is not None:
        if reason := family.abstract_reason(cls):
            raise TypeError(f"FixedDistrax({cls.__name__}): {_qualname(cls)} {reason}.")
        return family
    kind = repr(cls)
    if is_raw(cls):
        kind = f"an instance of {type(cls).__name__}"
    elif callable(cls) and getattr(cls, "__module__", "").startswith("numpyro."):
        kind += (
            ", a numpyro factory function, not a class (use the class it returns, e.g. "
            "`numpyro.distributions.CategoricalLogits` for `Categorical(logits=...)`)"
        )
    raise TypeError(
        "FixedDistrax expects a distrax, TFP-JAX or numpyro distribution or bijector "
        f"class as its first argument, got {kind}. Pass the class and its "
        "arguments: `FixedDistrax(distrax.Normal, loc, scale)`."
    )


def _bind(
    cls: Any, args: tuple, kwargs: dict, spec: dict | None = None
) -> tuple[Family, dict[str, Any]]:
    """The family of `cls` and its constructor arguments by name, as
    `inspect.Signature.bind` finds them (`bind_partial` for a `spec`, given its
    static arguments). An unknown keyword is named first, before `bind` would
    report a missing argument instead."""
    family = _check_class(cls)
    signature = family.signature(cls)
    parameters = signature.parameters.values()
    named = [p.name for p in parameters if p.kind in _KEYWORD]
    unknown = [n for n in [*kwargs, *(spec or {})] if n not in named]
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in parameters):
        raise TypeError(
            f"FixedDistrax({cls.__name__}): got an unexpected keyword argument "
            f"{unknown[0]!r}; {_qualname(cls)} takes {', '.join(named) or 'none'}."
        )
    bind = signature.bind if spec is None else signature.bind_partial
    try:
        return family, dict(bind(*args, **kwargs, **(spec or {})).arguments)
    except TypeError as e:
        where = "" if spec is None else ".spec"
        raise TypeError(f"FixedDistrax{where}({cls.__name__}): {e}") from None


_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _check_argument(cls: type, name: str, value: Any) -> None:
    """Reject constructor arguments that cannot live in a pytree."""
    where = f"FixedDistrax({cls.__name__}): argument `{name}`"
    for leaf in jtu.tree_leaves(value, is_leaf=lambda x: _is_dynamic(x) or is_raw(x)):
        if _is_dynamic(leaf):
            continue
        if is_raw(leaf):  # so it has a family
            qualname = _qualname(type(leaf))
            raise TypeError(
                f"{where} is a raw {qualname} instance, whose arrays would be hidden "
                f"from JAX. Wrap it too: `FixedDistrax({qualname}, ...)`."
            )
        try:
            hash(leaf)
        except TypeError:
            raise TypeError(
                f"{where} of type {type(leaf).__name__} is neither an array nor "
                "hashable (neither leaf nor static): pass an array or a hashable value."
            ) from None


def _floats_to_arrays(arguments: dict[str, Any], keep: frozenset) -> dict[str, Any]:
    """Python floats (outside the arguments `keep`) become arrays of the default
    float dtype (float32 unless x64 is on), not weakly typed; concrete ones, also
    when the wrapper is built under a trace (as the float was)."""
    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    to_array = lambda x: jnp.asarray(x, dtype) if type(x) is float else x  # noqa: E731
    with jax.ensure_compile_time_eval():
        return {
            n: v if n in keep else jtu.tree_map(to_array, v, is_leaf=_is_dynamic)
            for n, v in arguments.items()
        }


def _has_dynamic(value: Any) -> bool:
    return any(map(_is_dynamic, jtu.tree_leaves(value, is_leaf=_is_dynamic)))


def _show(value: Any) -> Any:
    """A dynamic field's value as given (static parts unhidden)."""
    unhide = lambda x: x.value if isinstance(x, Const) else x  # noqa: E731
    return jtu.tree_map(unhide, value, is_leaf=lambda x: isinstance(x, Const))


_SUBCLASSES: dict[tuple[str, ...], type] = {}
_SUBCLASSES_LOCK = threading.Lock()


def _subclass(dynamic: tuple[str, ...]) -> type:
    """The `FixedDistrax` subclass whose fields are the dynamic arguments, by name.

    Equinox derives key paths from field names, so a field per argument makes
    `jax.tree_util.tree_flatten_with_path` show `.loc` rather than an index. One
    class per set of names, also when several threads ask at once (two classes
    would give equal wrappers unequal tree structures).
    """
    with _SUBCLASSES_LOCK:
        if dynamic not in _SUBCLASSES:
            namespace = {
                "__annotations__": dict.fromkeys(dynamic, Any),
                "__module__": __name__,
                "__doc__": FixedDistrax.__doc__,
            }
            metaclass: type = type(FixedDistrax)  # Equinox's; pyright misreads it
            subclass = metaclass("FixedDistrax", (FixedDistrax,), namespace)
            for name in dynamic:  # (after the dataclass is made: not defaults)
                setattr(subclass, name, _Argument(name))
            _SUBCLASSES[dynamic] = subclass
        return _SUBCLASSES[dynamic]


class _Argument:
    """An array argument's field, read as `d.x`: the argument, where the library
    keeps it as given (or has no attribute `x`); else a `TypeError` saying how to
    reach either. A wrapper that cannot be built (a `tree_at` probe, a
    partitioned tree, a prefix spec) reads its fields as stored."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, wrapper: Any, owner: Any = None) -> Any:
        if wrapper is None:
            return self
        try:
            value = wrapper.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None
        paths, treedef = jtu.tree_flatten_with_path(wrapper)
        leaves = [x for _, x in paths]
        if not eqx.is_array(value) or not all(map(eqx.is_array, leaves)):
            return value
        if _in_tree_at():  # (as stored whatever the rule says: not traced)
            return value
        index = [p for p, _ in paths].index((jtu.GetAttrKey(self.name),))
        attribute = lambda xs: getattr(  # noqa: E731
            _build(resolve(jtu.tree_unflatten(treedef, xs)), False), self.name, None
        )
        try:
            how = _attributes.differs(attribute, leaves, index)
        except Exception:  # (it cannot be built: as stored)
            return value
        if how is None:
            return value
        qualname = _qualname(wrapper.cls)
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}).{self.name}: {qualname}'s "
            f"`{self.name}` is {how}, not the argument `{self.name}` as given, so "
            "the wrapper does not guess which you mean. "
            f"The argument: `d.arguments[{self.name!r}]` (the leaf that "
            f"`eqx.tree_at(lambda d: d.{self.name}, ...)` replaces); {qualname}'s: "
            f"`d.instantiate().{self.name}`."
        )

    def __set__(self, wrapper: Any, value: Any) -> None:
        wrapper.__dict__[self.name] = value


def _make(
    cls: type, static: _Static, dynamic: Mapping[str, Any], self: Any = None
) -> FixedDistrax:
    """A wrapper from its parts (`dynamic`: the fields, by name), without calling or
    checking anything; built in `self` if given. The instance becomes one of the
    subclass whose fields are the dynamic arguments (same layout: a plain
    `__dict__`) before any field is set."""
    self = object.__new__(FixedDistrax) if self is None else self
    object.__setattr__(self, "__class__", _subclass(static.dynamic))
    for name, value in {"cls": cls, "_static": static, **dynamic}.items():
        object.__setattr__(self, name, value)
    return self


def _call(distribution: bool, method: str, wrapper: Any, *args: Any, **kw: Any) -> Any:
    """Instantiate `wrapper` and call the uniform `method` on the result (the
    first two bound positionally, so no keyword of the call can replace them)."""
    _check_kind(wrapper, distribution, method)
    if method in ("kl_divergence", "cross_entropy"):
        check_kl(wrapper, method, next(iter([*args, *kw.values()]), None))
    fresh_arrays = _caches(wrapper)
    obj, args = built(wrapper), tuple(built(a, fresh_arrays) for a in args)
    return _family(wrapper.cls).call(obj, method, *args, **kw)


def built(x: Any, fresh_arrays: bool = False) -> Any:
    """The object a wrapper `x` builds for a method call (its arrays fresh
    references where a family caches by identity, or with `fresh_arrays`); any
    other `x` as it is (its arrays fresh with `fresh_arrays`)."""
    if not _is_wrapper(x):
        return _families.fresh(x) if fresh_arrays else x
    return _built(x, fresh_arrays or _caches(x))


class _Forwarded:
    """A forwarded method of the uniform set, named by its attribute: instantiate,
    then call the family's method of that name (`forward` for `__call__`). Bound
    to a wrapper it is a `jax.tree_util.Partial`, so `eqx.filter_jit(d.log_prob)`
    and a jitted function taking `d.log_prob` as an argument see the wrapper's
    arrays as inputs (`jax.jit(d.log_prob)`, as for any bound method, closes over
    them as constants)."""

    def __init__(self, distribution: bool, doc: str):
        self.distribution, self.__doc__ = distribution, doc

    def __set_name__(self, owner: type, name: str) -> None:
        method = "forward" if name == "__call__" else name
        self.function = functools.partial(_call, self.distribution, method)

    def __get__(self, wrapper: Any, owner: Any = None) -> Any:
        return self.function if wrapper is None else jtu.Partial(self.function, wrapper)


class _Property(property):
    """A forwarded property (named by its attribute): instantiate, then read it."""

    def __init__(self, distribution: bool, doc: str):
        getter = lambda wrapper: _get(wrapper, distribution, self.name)  # noqa: E731
        super().__init__(getter, doc=doc)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name


class FixedDistrax(eqx.Module):
    """A distrax, TFP-JAX or numpyro distribution or bijector as a proper PyTree.

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
    and `__call__` (= `forward`): one method set for distrax, TFP and numpyro alike
    (for numpyro, `mean` is a method as elsewhere, and `sample` takes `seed=` as
    elsewhere or numpyro's own `sample(key, sample_shape)`). Any other attribute
    falls through to the instantiated object; a method of it that returns a raw
    distribution or bijector (numpyro's `to_event`, say) returns it wrapped. An
    array argument named `mean` (numpyro's `NegativeBinomial2`, `BetaProportion`) is
    a field like any other, so on such a wrapper `d.mean` is that array, as
    numpyro's `mean` property is, and `ep.FixedDistrax.mean(d)` calls the forwarded
    method. (Their objects keep no `mean`, so a method that returns one, `to_event`
    say, returns it raw.)

    Construction checks the arguments by building the object once (with any
    `ep.Bijector`/`ep.Frozen` node among them resolved): the library's own checks
    run, numpyro's value checks included where its validation is on.

    No call mutates process-wide state, so wrappers may be used from several
    threads at once.
    """

    cls: type = eqx.field(static=True)
    _static: _Static = eqx.field(static=True)

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        family, arguments = _bind(cls, args, kwargs)
        for name, value in arguments.items():
            _check_argument(cls, name, value)
        arguments = _floats_to_arrays(arguments, family.static_floats(cls))
        arguments = family.prepare(cls, arguments)
        hide = lambda x: x if _is_dynamic(x) else Const(x)  # noqa: E731
        dynamic = {
            n: jtu.tree_map(hide, v, is_leaf=_is_dynamic)
            for n, v in arguments.items()
            if _has_dynamic(v)
        }
        for name in _RESERVED.intersection(dynamic):
            raise TypeError(
                f"FixedDistrax({cls.__name__}): the array argument `{name}` is named "
                "like a FixedDistrax attribute; please report this to eqxprob."
            )
        _make(cls, _Static(arguments, dynamic), dynamic, self)
        try:
            family.check_built(_build(resolve(self), False))
        except Exception as e:
            message = _failed(self, "rejected the arguments", e)
            if any(v is None or type(v) is int for v in arguments.values()):
                message += (
                    " (A prefix tree such as `jax.vmap`'s `in_axes` is built with "
                    f"`FixedDistrax.spec({cls.__name__}, ...)`, which calls no class.)"
                )
            error = type(e) if isinstance(e, (TypeError, ValueError)) else ValueError
            raise error(message) from e

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
        static_arguments = dict(static_arguments or {})
        arguments = _bind(cls, args, kwargs, static_arguments)[1]
        static = _Static(arguments, set(arguments) - set(static_arguments))
        return _make(cls, static, {n: arguments[n] for n in static.dynamic})

    @classmethod
    def from_instance(_cls, obj: Any) -> FixedDistrax:
        """Rebuild a raw distrax, TFP-JAX or numpyro object as a `FixedDistrax`.

        TFP objects are rebuilt from their `.parameters`, numpyro and distrax ones
        from the attributes that hold their constructor arguments; nested raw
        objects are rebuilt too. A distrax or numpyro rebuild is checked to
        flatten to the same arrays as the original. A `FixedDistrax` is returned
        unchanged.

        **Raises:**

        `TypeError` naming the class if `obj` is not such an object, or if its
        constructor arguments cannot be recovered faithfully: then wrap the
        class yourself, `ep.FixedDistrax(distrax.X, ...)`.

        **Example:**

        ```python
        import jax.numpy as jnp
        from tensorflow_probability.substrates import jax as tfp
        import eqxprob as ep

        wrapped = ep.FixedDistrax.from_instance(tfp.bijectors.Shift(jnp.array(2.0)))
        assert wrapped.forward(1.0) == 3.0
        ```
        """
        if isinstance(obj, FixedDistrax):
            return obj
        family = family_of_instance(obj)
        if family is None:
            raise TypeError(
                "FixedDistrax.from_instance expects a distrax, TFP-JAX or numpyro "
                f"distribution or bijector instance, got {obj!r}."
            )
        wrapped = _rebuilt(family, obj)
        if family is not _families.TFP and not _faithful(family, obj, wrapped):
            why = " faithfully (the rebuilt object holds different arrays)"
            raise _cannot_rebuild(obj, why)
        return wrapped

    # --- constructor arguments ---------------------------------------------

    @property
    def arguments(self) -> dict[str, Any]:
        """The constructor arguments by parameter name (nested wrappers kept)."""
        shown = {name: _show(value) for name, value in _fields(self).items()}
        values = {**dict(self._static.static), **shown}
        return {name: values[name] for name in self._static.names}

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
        static = self.__dict__.get("_static")
        if name.startswith("__") or name in ("cls", "_static") or static is None:
            raise AttributeError(name)
        for arg, value in static.static:
            if arg == name:
                if _probed_by_tree_at(self):
                    raise TypeError(_static_message(self, name, value))
                with contextlib.suppress(AttributeError):  # (the library's, if any:
                    return _fall_through(self, name)  # numpyro derives a `None`)
                return value
        return _fall_through(self, name)

    def _name_and_control_scope(self, name: Any = None) -> Any:
        # (TFP's `kl_divergence` enters this on both sides, also on a wrapper of
        # another family that `_dispatch` then rejects with a clear error.)
        return contextlib.nullcontext()

    def __iter__(self) -> Any:
        # (Not iterable, as TFP's objects: with `__getitem__` alone, Python would
        # iterate by index, without end for TFP, which clamps indices.)
        raise TypeError(f"FixedDistrax({self.cls.__name__}) is not iterable.")

    def __getitem__(self, index: Any) -> Any:
        """`d[index]`: the library's own batch slicing (distrax, TFP), wrapped."""
        try:
            getitem = _fall_through(self, "__getitem__")
        except AttributeError:
            name = _qualname(self.cls)
            raise TypeError(f"FixedDistrax({name}): {name} cannot be sliced.") from None
        return getitem(index)

    def __repr__(self) -> str:
        items = ", ".join([self.cls.__name__, *_items(self.arguments)])
        return f"FixedDistrax({items})"

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
            self.cls, self.arguments, path, subtree_renderer
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return _make, (self.cls, self._static, _fields(self))

    @property
    def is_distribution(self) -> bool:
        """Whether the wrapped class is a distribution (else a bijector)."""
        return _family(self.cls).is_distribution_class(self.cls)

    # --- the uniform method set: one line per forwarded method ---------------

    log_prob = _Forwarded(True, "Log density (or mass) of `value`.")
    prob = _Forwarded(True, "Density (or mass) of `value`.")
    cdf = _Forwarded(True, "Cumulative distribution function at `value`.")
    log_cdf = _Forwarded(True, "Log of the CDF at `value`.")
    sample = _Forwarded(True, "`sample(seed=, sample_shape=())`: samples.")
    sample_and_log_prob = _Forwarded(True, "`(samples, log_prob(samples))`.")
    mean = _Forwarded(True, "The mean.")
    mode = _Forwarded(True, "The mode.")
    variance = _Forwarded(True, "The variance.")
    stddev = _Forwarded(True, "The standard deviation.")
    entropy = _Forwarded(True, "The (differential) entropy.")
    kl_divergence = _Forwarded(True, "KL(self || other); `other` wrapped or raw.")
    cross_entropy = _Forwarded(True, "Cross entropy of `other` relative to self.")
    batch_shape = _Property(True, "The batch shape, a tuple for every family.")
    event_shape = _Property(True, "The event shape, a tuple for every family.")
    dtype = _Property(True, "The dtype of samples.")
    forward = _Forwarded(False, "y = f(x).")
    inverse = _Forwarded(False, "x = f⁻¹(y).")
    forward_log_det_jacobian = _Forwarded(False, "log|det J(f)(x)|.")
    inverse_log_det_jacobian = _Forwarded(False, "log|det J(f⁻¹)(y)|.")
    forward_and_log_det = _Forwarded(False, "`(f(x), log|det J(f)(x)|)`.")
    inverse_and_log_det = _Forwarded(False, "`(f⁻¹(y), log|det J(f⁻¹)(y)|)`.")
    event_ndims_in = _Property(False, "Trailing axes one log-det term consumes.")
    __call__ = _Forwarded(False, "Same as `forward`.")


# Names an array argument's field may not take: the wrapper's own attributes.
# Except `mean`, which numpyro's `NegativeBinomial2` and `BetaProportion` take as
# an array: the field shadows the forwarded method on such a wrapper (`d.mean` is
# the argument, as numpyro's `mean` property is; `FixedDistrax.mean(d)` calls the
# method), since eqxprob's own code calls no wrapper's `mean`.
_RESERVED = frozenset(dir(FixedDistrax)) - {"mean"}


def _probed_by_tree_at(wrapper: FixedDistrax) -> bool:
    """Whether `eqx.tree_at` is calling its `where` on `wrapper` (its leaves are then
    Equinox's private `equinox._tree._LeafWrapper`s; pinned by a test)."""
    return any(
        type(x).__name__ == "_LeafWrapper" and type(x).__module__ == "equinox._tree"
        for x in jtu.tree_leaves(wrapper)
    )


def _in_tree_at() -> bool:
    """Whether `eqx.tree_at` is calling its `where`, up the stack: it calls it on
    the tree itself too, and wants the field it holds (pinned by tests)."""
    frame = sys._getframe(2)
    for _ in range(16):  # (the where-function may call helpers)
        if frame is None or frame.f_code is _TREE_AT:
            return frame is not None
        frame = frame.f_back
    return False


_TREE_AT = inspect.unwrap(eqx.tree_at).__code__


def _static_message(wrapper: FixedDistrax, name: str, value: Any) -> str:
    qualname = _qualname(wrapper.cls)
    why, fix = f"a static Python float ({qualname} branches on it)", "."
    if type(value) is not float:
        why = f"static (a {type(value).__name__}, part of the structure)"
        fix = ", or pass an array (`jnp.asarray(...)`) if it is a parameter."
    return (
        f"FixedDistrax({wrapper.cls.__name__}): the argument `{name}` = {value!r} is "
        f"{why}, not a leaf: `eqx.tree_at` cannot replace it. Build a new wrapper{fix}"
    )


def _fields(wrapper: FixedDistrax) -> dict[str, Any]:
    """The dynamic fields of `wrapper`, by name, as stored."""
    return {name: wrapper.__dict__[name] for name in wrapper._static.dynamic}


def _caches(wrapper: FixedDistrax) -> bool:
    """Whether `wrapper` builds any object of a family that caches by identity."""
    if _family(wrapper.cls).caches_by_identity:
        return True
    nested = jtu.tree_leaves(_fields(wrapper), is_leaf=_is_wrapper)
    return any(_caches(w) for w in nested if _is_wrapper(w))


def _build(wrapper: FixedDistrax, fresh_arrays: bool) -> Any:
    """Instantiate `wrapper`; with `fresh_arrays`, every array is a fresh reference."""

    def value(x: Any) -> Any:
        if _is_wrapper(x):
            return _build(x, fresh_arrays)
        return _families.fresh(x) if fresh_arrays else x

    arguments = wrapper.arguments
    for name in wrapper._static.dynamic:
        arguments[name] = jtu.tree_map(value, arguments[name], is_leaf=_is_wrapper)
    signature = _family(wrapper.cls).signature(wrapper.cls)
    bound = inspect.BoundArguments(signature, arguments)  # pyright: ignore[reportArgumentType]
    return wrapper.cls(*bound.args, **bound.kwargs)


def _built(wrapper: FixedDistrax, fresh_arrays: bool) -> Any:
    """`_build` for a method call: an error names the class and its arguments (a
    field that `eqx.tree_at` replaced by one of another shape, say)."""
    try:
        return _build(wrapper, fresh_arrays)
    except (TypeError, ValueError) as e:
        message = _failed(wrapper, "cannot be built from its arguments", e) + (
            ". A field replaced by `eqx.tree_at` needs a shape and dtype it accepts."
        )
        raise (TypeError if isinstance(e, TypeError) else ValueError)(message) from e


def _failed(wrapper: FixedDistrax, what: str, e: Exception) -> str:
    """The message of `e`, raised building `wrapper`: its class and arguments."""
    items = ", ".join(_items(wrapper.arguments))
    name, qualname = wrapper.cls.__name__, _qualname(wrapper.cls)
    return f"FixedDistrax({name}): {qualname} {what} ({items}): {e}"


def check_kl(wrapper: FixedDistrax, method: str, other: Any) -> None:
    """numpyro's KL registry and distrax/TFP's do not know each other's classes."""
    ours = _family(wrapper.cls)
    cls = other.cls if _is_wrapper(other) else type(other)
    theirs = family_of(cls) if _is_wrapper(other) else family_of_instance(other)
    if theirs not in (None, ours) and _families.NUMPYRO in (ours, theirs):
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}).{method}: the other distribution "
            f"is a {theirs.qualname(cls)} and this one a {ours.qualname(wrapper.cls)}; "  # pyright: ignore[reportOptionalMemberAccess]
            "numpyro's KL registry and distrax/TFP's do not know each other's "
            "classes. Wrap both from one library or write the KL from their parameters."
        )


def _check_kind(wrapper: FixedDistrax, distribution: bool, method: str) -> None:
    if wrapper.is_distribution != distribution:
        kind, other = ["distribution", "bijector"][:: 1 if distribution else -1]
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}) wraps a {other}; `{method}` is "
            f"only available on a wrapped {kind}."
        )


def _get(wrapper: Any, distribution: bool, name: str) -> Any:
    """Instantiate `wrapper` and read its property `name`."""
    _check_kind(wrapper, distribution, name)
    return _family(wrapper.cls).get(_built(wrapper, _caches(wrapper)), name)


def _fall_through(wrapper: FixedDistrax, name: str) -> Any:
    """The built object's attribute `name`; a method of it wraps what it returns."""
    fresh_arrays = _caches(wrapper)
    attribute = getattr(_built(wrapper, fresh_arrays), name)
    if inspect.ismethod(attribute):
        return functools.partial(_call_through, attribute, fresh_arrays)
    return attribute


def _call_through(method: Any, fresh_arrays: bool, *args: Any, **kwargs: Any) -> Any:
    """Call a fallen-through method; wrap a raw distribution or bijector it returns."""
    if fresh_arrays:
        args, kwargs = _families.fresh((args, kwargs))
    out = method(*args, **kwargs)
    with contextlib.suppress(TypeError):  # (returned raw if it cannot be rebuilt)
        return _wrap_raw(out)
    return out


def _format(value: Any) -> str:
    """`value` as text: arrays as `f32[3]`, nested wrappers by their `repr`."""
    as_repr = lambda x: wl.TextDoc(repr(x)) if _is_wrapper(x) else x  # noqa: E731
    value = jtu.tree_map(as_repr, value, is_leaf=_is_wrapper)
    return eqx.tree_pformat(value, short_arrays=True, width=10_000)


def _items(arguments: Mapping[str, Any]) -> list[str]:
    """`name=value` for each argument, arrays shown as `f32[3]`."""
    return [f"{name}={_format(value)}" for name, value in arguments.items()]


def _wrap_raw(x: Any) -> Any:
    return FixedDistrax.from_instance(x) if is_raw(x) else x


def _cannot_rebuild(obj: Any, why: str) -> TypeError:
    qualname = _qualname(type(obj))
    return TypeError(
        f"Cannot rebuild the raw {qualname} from its attributes{why}. Wrap it "
        f"yourself: `ep.FixedDistrax({qualname}, ...)` with its arguments."
    )


def _rebuilt(family: Family, obj: Any, checks: bool = True) -> FixedDistrax:
    """`obj` rebuilt as a wrapper from its attributes (nested raw objects too),
    not yet compared with it; without the class's value `checks` if it takes
    `validate_args` (numpyro)."""
    try:
        arguments = family.arguments_of(obj)
    except TypeError as e:
        raise _cannot_rebuild(obj, f" ({e})") from None
    arguments = jtu.tree_map(_wrap_raw, arguments, is_leaf=is_raw)
    try:
        if not checks and "validate_args" in family.signature(type(obj)).parameters:
            arguments["validate_args"] = False
        return FixedDistrax(type(obj), **arguments)
    except (TypeError, ValueError) as e:
        raise _cannot_rebuild(obj, f": {e}") from None


def _faithful(family: Family, obj: Any, wrapped: FixedDistrax) -> bool:
    """Whether `wrapped`, rebuilt from `obj`'s attributes, holds `obj`'s arrays:
    compared by value when they are concrete. Under a trace, the same rebuild of
    a twin of `obj` (its class and static part, concrete stand-in arrays) must
    give back the twin's arrays: a class that keeps a derived array under an
    argument's name (distrax's `Softmax` keeps `logits / temperature`) fails."""
    leaves, treedef = jtu.tree_flatten(obj)
    if not any(isinstance(x, jax.core.Tracer) for x in leaves):
        return _leaves_match(wrapped.instantiate(), obj)
    rng = np.random.default_rng(0)

    def stand_in(x: Any) -> Any:
        if not eqx.is_array(x):
            return x
        return rng.uniform(0.5, 1.5, jnp.shape(x)).astype(jnp.result_type(x))

    with jax.ensure_compile_time_eval():
        try:  # (the twin built by its class, which keeps the class's invariants;
            # stand-ins need not satisfy its value checks)
            twin0 = jtu.tree_unflatten(treedef, list(map(stand_in, leaves)))
            twin = _rebuilt(family, twin0, checks=False).instantiate()
            again = _rebuilt(family, twin, checks=False).instantiate()
            return _leaves_match(again, twin)
        except (TypeError, ValueError):
            return False


def _leaves_match(a: Any, b: Any) -> bool:
    """Whether two raw objects with concrete arrays flatten to equal leaves."""

    def same(x: Any, y: Any) -> bool:
        if not (eqx.is_array_like(x) and eqx.is_array_like(y)):
            return x is y or x == y
        alike = (jnp.shape(x), jnp.result_type(x)) == (jnp.shape(y), jnp.result_type(y))
        return alike and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)

    la, lb = jtu.tree_leaves(a), jtu.tree_leaves(b)
    return len(la) == len(lb) and all(map(same, la, lb))
