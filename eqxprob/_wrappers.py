"""`FixedDistrax`: a distrax, TFP-JAX or numpyro object as a proper PyTree.

distrax's `Jittable`, TFP's JAX pytrees and numpyro's pytrees flatten into derived
caches, order their leaves unstably or carry unequal metadata, so `eqx.filter_grad`,
`eqx.partition`, `eqx.tree_at` and friends fail on them. Following the Equinox author's
advice, `FixedDistrax` holds the class and its constructor arguments instead, and
builds the object at every call. It is a PyTree node registered with keys: its
children are the array arguments (and nested wrappers), each keyed by its name
(`.loc`); its auxiliary data is the class and the other arguments.

Attributes, in one rule: an argument is the attribute of its name, as stored; the
uniform methods below (one line each) are there because a library lacks or
misspells them, and go through the family adapter; every other public attribute
is the built object's own, a method as a `Method` (a PyTree).

Everything specific to a library lives in `_families.py`, also how numpyro's free
functions that dispatch on classes (`kl_divergence`, `vmap_over`) take wrappers.
"""

from __future__ import annotations

import inspect
from collections.abc import Container, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl

from . import _families
from ._families import Family, Wrapped, family_of, family_of_instance, is_raw
from ._node import resolve
from ._static import Const, float_key


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


class _Static(Const):
    """The auxiliary data of a wrapper: argument names, the non-array arguments,
    and which array arguments hold static parts (a callable in a list of wrappers).

    Compared by value, type included (`float_key`), so two wrappers built separately
    from equal arguments share one compiled function, and `1`, `1.0` and `True`
    differ, as do `0.0` and `-0.0`.
    """

    __slots__ = ("names", "dynamic", "static", "hidden")

    def __init__(
        self, arguments: Mapping[str, Any], dynamic: Container[str], hidden: Any = ()
    ) -> None:
        self.names = tuple(arguments)
        self.dynamic = tuple(n for n in arguments if n in dynamic)
        self.static = tuple((n, v) for n, v in arguments.items() if n not in dynamic)
        self.hidden = frozenset(hidden)  # (the children's structure shows it)
        key = (self.names, self.dynamic, float_key(self.static))
        super().__init__(self.static, key)


def _check_class(cls: Any, args: tuple = (), kwargs: Any = None) -> Family:
    """The family of `cls`, or a `TypeError` saying what `cls` is instead (for a
    numpyro factory function, the class it returns for `args`, `kwargs`)."""
    family = family_of(cls)
    if family is not None:
        if reason := family.abstract_reason(cls):
            raise TypeError(f"FixedDistrax({cls.__name__}): {_qualname(cls)} {reason}.")
        return family
    kind = repr(cls)
    if is_raw(cls):
        kind = f"an instance of {type(cls).__name__}"
    elif callable(cls) and getattr(cls, "__module__", "").startswith("numpyro."):
        try:  # (which class it returns here; its own error otherwise)
            made = type(cls(*built(args), **built(kwargs or {}))).__name__
        except Exception:  # noqa: BLE001
            made = "CategoricalLogits` for `Categorical(logits=...)"
        kind += (
            ", a numpyro factory function, not a class: wrap the class it returns, "
            f"`numpyro.distributions.{made}` (or call it on `d.instantiate()` for "
            "the raw object)"
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
    family = _check_class(cls, args, kwargs)
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
        arguments = dict(bind(*args, **kwargs, **(spec or {})).arguments)
    except TypeError as e:
        where = "" if spec is None else ".spec"
        raise TypeError(f"FixedDistrax{where}({cls.__name__}): {e}") from None
    for name in _OWN.intersection(arguments):
        raise TypeError(
            f"FixedDistrax({cls.__name__}): the argument `{name}` is named like a "
            "FixedDistrax attribute; please report this to eqxprob."
        )
    return family, arguments


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


def _make(cls: type, static: _Static, children: Any, self: Any = None) -> FixedDistrax:
    """A wrapper from its parts, without calling or checking anything (built in
    `self` if given): each argument is stored under its name, the children
    (`Const`s hide static parts of array arguments) apart, for flattening."""
    self = object.__new__(FixedDistrax) if self is None else self
    values = dict(static.static)
    for name, child in zip(static.dynamic, children):
        values[name] = _unhide(child) if name in static.hidden else child
    values.update(cls=cls, _static=static, _children=tuple(children))
    self.__dict__.update(values)
    return self


def _unhide(child: Any) -> Any:
    unhide = lambda x: x.value if isinstance(x, Const) else x  # noqa: E731
    return jtu.tree_map(unhide, child, is_leaf=lambda x: isinstance(x, Const))


class Method(eqx.Module):
    """A wrapper's method, bound: a PyTree holding the wrapper, so that
    `eqx.filter_jit(d.log_prob)` and a jitted function taking `d.log_prob` as an
    argument see the wrapper's arrays as inputs (as Equinox's bound methods do).
    Calling it builds the object and calls its method `name` (for the uniform
    set, the family's)."""

    wrapper: FixedDistrax
    name: str = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _invoke(self.wrapper, self.name, args, kwargs)


class _Uniform:
    """A uniform method, named by its attribute: a `Method` of the wrapper (on the
    class, a function of it: `FixedDistrax.sample(d, seed=key)`); `distribution`
    says which kind of wrapper has it. A non-data descriptor, so an argument of
    the same name (distrax's `Lambda(forward=...)`) is the attribute instead."""

    def __init__(self, distribution: bool, doc: str):
        self.distribution, self.__doc__ = distribution, doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "forward" if name == "__call__" else name
        _UNIFORM[self.name] = self.distribution

    def __get__(self, wrapper: Any, owner: Any = None) -> Any:
        if wrapper is None:
            return lambda wrapper, *a, **kw: _invoke(wrapper, self.name, a, kw)
        return Method(wrapper, self.name)


class _Property(_Uniform):
    """A uniform property (named by its attribute): the built object's, through
    the family adapter."""

    def __get__(self, wrapper: Any, owner: Any = None) -> Any:
        if wrapper is None:
            return self
        _check_kind(wrapper, self.distribution, self.name)
        return _family(wrapper.cls).get(_built(wrapper, _caches(wrapper)), self.name)


_UNIFORM: dict[str, bool] = {}  # uniform method name -> whether a distribution's


class FixedDistrax(Wrapped):
    """A distrax, TFP-JAX or numpyro distribution or bijector as a proper PyTree.

    **A field is its argument**: `d.loc` is the `loc` you gave (or `eqx.tree_at`
    put there), in every context; the library's own value (broadcast, normalised,
    derived) is `d.instantiate().loc`. Every other attribute is the library's own,
    of its own kind (numpyro's `d.mean` a value, distrax's `d.mean()` a call), built
    afresh at each use, which costs nothing after `jax.jit`. A method returning a
    distribution or bijector returns it wrapped (`FixedDistrax.from_instance`), and
    slicing `d[index]` is the library's own, wrapped; where that rebuild would not
    be faithful, a `TypeError` says so and names the raw way,
    `d.instantiate()[index]`.

    The leaves are exactly the array arguments, each keyed by its constructor
    parameter, so `eqx.filter_grad`, `eqx.partition` / `eqx.combine`,
    `eqx.tree_at(lambda d: d.loc, ...)`, `jax.jit`, `jax.vmap`, `lax.scan`,
    serialisation and optax all work, and key paths read `.loc`. Arguments split:

    - arrays (JAX or NumPy) and nested `FixedDistrax` objects, also inside lists,
      tuples and dicts, are leaves (an `ep.Bijector` node among them is resolved by
      `ep.resolve`, as in the example below);
    - **Python floats become arrays** of the default float dtype (float32, or
      float64 with `jax_enable_x64`), as distrax itself converts them: they are
      trained, saved and loaded like any parameter. The few arguments a class
      branches on in Python stay static floats (see the "supported families"
      page, e.g. `distrax.RationalQuadraticSpline`'s `range_min`);
    - everything else (Python ints, bools, strings, `None`, dtypes, callables) is
      static and compared by value and type, so an equal wrapper built separately
      does not recompile.

    One uniform method set fills what a library lacks or spells otherwise, listed
    with its reasons on the "supported families" page: `sample(seed=,
    sample_shape=)` (numpyro also takes its own `sample(key, sample_shape)`),
    `sample_and_log_prob`, `prob`, `log_cdf`, `stddev()`, `kl_divergence(other)`,
    `cross_entropy(other)`, `batch_shape`/`event_shape` (tuples), `dtype`;
    bijectors: `forward`, `inverse`, `forward_and_log_det`, `inverse_and_log_det`,
    `forward_log_det_jacobian`, `inverse_log_det_jacobian`, `event_ndims_in` and
    `__call__` (= `forward`). A wrapped argument of any method is built first.

    Construction checks the arguments by building the object once (with any
    `ep.Bijector`/`ep.Frozen` node among them resolved): the library's own checks
    run, numpyro's value checks included where its validation is on. No call
    mutates process-wide state, so wrappers may be used from several threads.

    **Arguments:**

    - `cls`: a concrete distrax, TFP-JAX or numpyro distribution or bijector class.
    - `*args`, `**kwargs`: its constructor arguments.

    **Raises:**

    `TypeError` if `cls` is not such a class, a keyword is unknown, or an argument
    can be neither a leaf nor static; `TypeError`/`ValueError` naming the class if
    it rejects the arguments (checked by building it once at construction).

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import numpyro.distributions as nd
    import optax
    import eqxprob as ep

    data = jnp.array([1.8, 2.4, 2.1, 1.6])
    model = ep.FixedDistrax(nd.Normal, jnp.array(0.0), ep.positive(0.5))

    def loss(model):
        model = ep.resolve(model)  # the scale's constrained value
        return -model.log_prob(data).sum()

    model, _ = ep.fit(model, loss, optimiser=optax.adam(0.05), steps=500,
                      progress=False)
    fitted = ep.resolve(model)  # the library's object needs the scale's value
    assert abs(fitted.loc - data.mean()) < 0.01 and fitted.scale > 0
    assert fitted.mean == fitted.loc  # numpyro's `mean`: a property, as in numpyro
    ```
    """

    cls: type

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        family, arguments = _bind(cls, args, kwargs)
        for name, value in arguments.items():
            _check_argument(cls, name, value)
        arguments = _floats_to_arrays(arguments, family.static_floats(cls))
        arguments = family.prepare(cls, arguments)
        dynamic = [n for n, v in arguments.items() if _has_dynamic(v)]
        parts = {n: jtu.tree_leaves(arguments[n], is_leaf=_is_dynamic) for n in dynamic}
        hidden = [n for n in dynamic if not all(map(_is_dynamic, parts[n]))]
        static = _Static(arguments, dynamic, hidden)
        hide = lambda x: x if _is_dynamic(x) else Const(x)  # noqa: E731
        _make(
            cls,
            static,
            [jtu.tree_map(hide, arguments[n], is_leaf=_is_dynamic) for n in dynamic],
            self,
        )
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
        return _make(cls, static, [arguments[n] for n in static.dynamic])

    @classmethod
    def from_instance(_cls, obj: Any) -> FixedDistrax:
        """Rebuild a raw distrax, TFP-JAX or numpyro object as a `FixedDistrax`.

        TFP objects are rebuilt from their `.parameters` (TFP's contract: the
        constructor arguments); distrax and numpyro ones, which have no such
        contract, from the attributes that hold their constructor arguments, and
        the rebuild is accepted only if it holds the very same arrays (a Python or
        NumPy value: the array the wrapper makes of it). So a class that keeps a
        computed array under an argument's name (distrax's `Categorical`
        normalises `probs`) is refused, eagerly and under `jit` alike. Nested raw
        objects are rebuilt too; a `FixedDistrax` is returned unchanged.

        **Raises:**

        `TypeError` naming the class if `obj` is not such an object or cannot be
        rebuilt so: then wrap the class yourself, `ep.FixedDistrax(distrax.X, ...)`.

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
        try:
            arguments = family.arguments_of(obj)
            wrapped = FixedDistrax(type(obj), **_wrap_raw(arguments))
        except (TypeError, ValueError) as e:
            raise _cannot_rebuild(obj, f" ({e})") from None
        if not _kept(family, wrapped.instantiate(), obj):
            raise _cannot_rebuild(
                obj, " faithfully (the rebuilt object holds other arrays)"
            )
        return wrapped

    @property
    def arguments(self) -> dict[str, Any]:
        """The constructor arguments by parameter name (nested wrappers kept)."""
        return {name: self.__dict__[name] for name in self._static.names}

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

    @property
    def is_distribution(self) -> bool:
        """Whether the wrapped class is a distribution (else a bijector)."""
        return _family(self.cls).is_distribution_class(self.cls)

    def __getattr__(self, name: str) -> Any:
        # Only when normal lookup fails (arguments are in `__dict__`): the built
        # object's public attribute, a method of it as a `Method`.
        if name.startswith("_") or "_static" not in self.__dict__:
            raise AttributeError(name)
        obj = _built(self, _caches(self))
        if not hasattr(type(obj), name) and name not in getattr(obj, "__dict__", {}):
            raise AttributeError(
                f"FixedDistrax({self.cls.__name__}): {_qualname(self.cls)} has no "
                f"attribute `{name}` (nor is it an argument)."
            )
        value = getattr(obj, name)
        return Method(self, name) if inspect.ismethod(value) else value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"FixedDistrax is immutable: use `eqx.tree_at(lambda d: d.{name}, d, ...)`."
        )

    def __iter__(self) -> Any:
        # (Not iterable, as TFP's objects: with `__getitem__` alone, Python would
        # iterate by index, without end for TFP, which clamps indices.)
        raise TypeError(f"FixedDistrax({self.cls.__name__}) is not iterable.")

    def __getitem__(self, index: Any) -> Any:
        """`d[index]`: the library's own batch slicing (distrax, TFP), wrapped."""
        obj = _built(self, _caches(self))
        if not hasattr(type(obj), "__getitem__"):
            name = _qualname(self.cls)
            raise TypeError(f"FixedDistrax({name}): {name} cannot be sliced.")
        return _wrapped(self, f"[{index!r}]", obj[index])

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

    # --- the uniform set: what a library lacks or spells otherwise, one line each

    sample = _Uniform(True, "`sample(seed=, sample_shape=())`: samples.")
    sample_and_log_prob = _Uniform(True, "`(samples, log_prob(samples))`.")
    prob = _Uniform(True, "Density (or mass) of `value`.")
    log_cdf = _Uniform(True, "Log of the CDF at `value`.")
    stddev = _Uniform(True, "The standard deviation.")
    kl_divergence = _Uniform(True, "KL(self || other); `other` wrapped or raw.")
    cross_entropy = _Uniform(True, "Cross entropy of `other` relative to self.")
    batch_shape = _Property(True, "The batch shape, a tuple for every family.")
    event_shape = _Property(True, "The event shape, a tuple for every family.")
    dtype = _Property(True, "The dtype of samples.")
    forward = _Uniform(False, "y = f(x).")
    inverse = _Uniform(False, "x = f⁻¹(y).")
    forward_log_det_jacobian = _Uniform(False, "log|det J(f)(x)|.")
    inverse_log_det_jacobian = _Uniform(False, "log|det J(f⁻¹)(y)|.")
    forward_and_log_det = _Uniform(False, "`(f(x), log|det J(f)(x)|)`.")
    inverse_and_log_det = _Uniform(False, "`(f⁻¹(y), log|det J(f⁻¹)(y)|)`.")
    event_ndims_in = _Property(False, "Trailing axes one log-det term consumes.")
    __call__ = _Uniform(False, "Same as `forward`.")


# Names no argument may take: the wrapper's own state and API.
_OWN = frozenset({"cls", "_static", "_children", "arguments", "instantiate"})


# Children: the array arguments, keyed by name; auxiliary data: the rest.
jtu.register_pytree_with_keys(
    FixedDistrax,
    lambda d: (
        tuple(zip(map(jtu.GetAttrKey, d._static.dynamic), d._children)),
        _aux(d),
    ),
    lambda aux, children: _make(aux[0], aux[1], children),
    lambda d: (d._children, _aux(d)),
)


def _aux(d: FixedDistrax) -> tuple:
    return d.cls, d._static


def _invoke(wrapper: FixedDistrax, name: str, args: tuple, kwargs: dict) -> Any:
    """Build `wrapper` and call its method `name` (through the family adapter, for
    the uniform set) on the built arguments; a distribution or bijector it returns
    comes back wrapped."""
    if name in _UNIFORM:
        _check_kind(wrapper, _UNIFORM[name], name)
    fresh = _caches(wrapper)
    obj, (args, kwargs) = _built(wrapper, fresh), built((args, kwargs), fresh)
    out = _family(wrapper.cls).call(obj, name, *args, **kwargs)
    return _wrapped(wrapper, f".{name}(...)", out)


def built(x: Any, fresh_arrays: bool = False) -> Any:
    """`x` with every wrapper in it built (its arrays fresh references where a
    family caches by identity, or everywhere with `fresh_arrays`)."""

    def one(y: Any) -> Any:
        if _is_wrapper(y):
            return _built(y, fresh_arrays or _caches(y))
        return _families.fresh(y) if fresh_arrays else y

    return jtu.tree_map(one, x, is_leaf=_is_wrapper)


def _wrapped(wrapper: FixedDistrax, what: str, out: Any) -> Any:
    """`out` with each raw distribution or bijector in it wrapped, or a
    `TypeError` naming `d.instantiate(){what}`, the raw way."""
    try:
        return _wrap_raw(out)
    except TypeError as e:
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}){what} returns a raw object, which "
            f"cannot be wrapped: {e} The raw result: `d.instantiate(){what}`."
        ) from None


def _wrap_raw(x: Any) -> Any:
    """`x` with each raw distribution or bijector in it rebuilt as a wrapper."""
    wrap = lambda y: FixedDistrax.from_instance(y) if is_raw(y) else y  # noqa: E731
    return jtu.tree_map(wrap, x, is_leaf=is_raw)


def _check_kind(wrapper: FixedDistrax, distribution: bool, method: str) -> None:
    if wrapper.is_distribution != distribution:
        kind, other = ["distribution", "bijector"][:: 1 if distribution else -1]
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}) wraps a {other}; `{method}` is "
            f"only available on a wrapped {kind}."
        )


def _caches(wrapper: FixedDistrax) -> bool:
    """Whether `wrapper` builds any object of a family that caches by identity."""
    if _family(wrapper.cls).caches_by_identity:
        return True
    nested = jtu.tree_leaves(wrapper._children, is_leaf=_is_wrapper)
    return any(_caches(w) for w in nested if _is_wrapper(w))


def _build(wrapper: FixedDistrax, fresh_arrays: bool) -> Any:
    """Instantiate `wrapper`; with `fresh_arrays`, every array is a fresh reference."""
    arguments = wrapper.arguments
    for name in wrapper._static.dynamic:
        arguments[name] = built(arguments[name], fresh_arrays)
    signature = _family(wrapper.cls).signature(wrapper.cls)
    bound = inspect.BoundArguments(signature, arguments)  # pyright: ignore[reportArgumentType]
    return wrapper.cls(*bound.args, **bound.kwargs)


def _built(wrapper: FixedDistrax, fresh_arrays: bool) -> Any:
    """`_build` for a call: an error names the class and its arguments (a field
    that `eqx.tree_at` replaced by one of another shape, say)."""
    try:
        return _build(wrapper, fresh_arrays)
    except (TypeError, ValueError) as e:
        message = _failed(wrapper, "cannot be built from its arguments", e) + (
            " (a field replaced by `eqx.tree_at` needs a shape and dtype it accepts)"
        )
        raise (TypeError if isinstance(e, TypeError) else ValueError)(message) from e


def _failed(wrapper: FixedDistrax, what: str, e: Exception) -> str:
    """The message of `e`, raised building `wrapper`: its class and arguments."""
    items = ", ".join(_items(wrapper.arguments))
    name, qualname = wrapper.cls.__name__, _qualname(wrapper.cls)
    return f"FixedDistrax({name}): {qualname} {what} ({items}): {e}"


def _format(value: Any) -> str:
    """`value` as text: arrays as `f32[3]`, nested wrappers by their `repr`."""
    as_repr = lambda x: wl.TextDoc(repr(x)) if _is_wrapper(x) else x  # noqa: E731
    value = jtu.tree_map(as_repr, value, is_leaf=_is_wrapper)
    return eqx.tree_pformat(value, short_arrays=True, width=10_000)


def _items(arguments: Mapping[str, Any]) -> list[str]:
    """`name=value` for each argument, arrays shown as `f32[3]`."""
    return [f"{name}={_format(value)}" for name, value in arguments.items()]


def _cannot_rebuild(obj: Any, why: str) -> TypeError:
    qualname = _qualname(type(obj))
    return TypeError(
        f"FixedDistrax.from_instance: the raw {qualname} cannot be rebuilt from its "
        f"attributes{why}. Wrap it yourself: `ep.FixedDistrax({qualname}, ...)` with "
        "its arguments."
    )


def _kept(family: Family, rebuilt: Any, obj: Any) -> bool:
    """Whether `rebuilt` keeps, under each argument's name, the very array that
    `obj` keeps there (for a Python or NumPy value of `obj`: the array the wrapper
    made of it, equal in its dtype), nested raw objects alike: then the class keeps
    its arguments as given, and `obj`'s are the arguments it was built from."""
    if family.arguments_by_contract:
        return True
    a, ta = jtu.tree_flatten(family.arguments_of(rebuilt), is_leaf=is_raw)
    b, tb = jtu.tree_flatten(family.arguments_of(obj), is_leaf=is_raw)

    def same(x: Any, y: Any) -> bool:
        if is_raw(y):
            return type(x) is type(y) and _kept(family_of_instance(y), x, y)  # pyright: ignore[reportArgumentType]
        if x is y or isinstance(y, jax.Array) or not eqx.is_array(x):
            return x is y or (not eqx.is_array(y) and bool(x == y))
        return np.array_equal(np.asarray(x), np.asarray(y, x.dtype), equal_nan=True)

    return ta == tb and all(map(same, a, b))
