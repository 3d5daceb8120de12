"""`FixedDistrax`: distrax and TFP-JAX distributions and bijectors as proper pytrees.

distrax's `Jittable` and TFP's JAX pytrees flatten into derived caches and carry
unhashable, unequal metadata, so `eqx.filter_grad`, `eqx.partition`, `eqx.tree_at`
and friends fail on them. Following the Equinox author's advice, `FixedDistrax` holds
the class and its constructor arguments instead, and instantiates the object lazily at
every method call. Its leaves are exactly the array arguments it was given.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import distrax
import equinox as eqx
import jax.tree_util as jtu
from tensorflow_probability.substrates import jax as tfp


tfd = tfp.distributions
tfb = tfp.bijectors

_DISTRIBUTION_BASES = (distrax.Distribution, tfd.Distribution)
_BIJECTOR_BASES = (distrax.Bijector, tfb.Bijector)
_RAW_BASES = _DISTRIBUTION_BASES + _BIJECTOR_BASES


def _is_wrapper(x: Any) -> bool:
    return isinstance(x, FixedDistrax)


def _is_dynamic(x: Any) -> bool:
    """Leaves of a wrapper: arrays (jax or numpy) and nested wrappers."""
    return eqx.is_array(x) or _is_wrapper(x)


def _is_raw(x: Any) -> bool:
    return isinstance(x, _RAW_BASES)


def _qualname(cls: type) -> str:
    module = cls.__module__
    if module.startswith("distrax"):
        return f"distrax.{cls.__name__}"
    if module.startswith("tensorflow_probability"):
        family = "tfb" if issubclass(cls, tfb.Bijector) else "tfd"
        return f"{family}.{cls.__name__}"
    return cls.__name__


@functools.cache
def _signature(cls: type) -> inspect.Signature:
    """The constructor signature without `self`.

    TFP decorates `__init__` and hides it behind `(*args, **kwargs)` on the class,
    so read `cls.__init__` rather than `cls`.
    """
    signature = inspect.signature(cls.__init__)
    parameters = list(signature.parameters.values())[1:]
    return signature.replace(parameters=parameters)


class _Static:
    """The non-array part of a wrapper's constructor arguments.

    Stored as a static field, so it must hash and compare by value: two wrappers
    built separately from equal arguments then share one compiled function. Values
    are compared together with their type, so `1` and `1.0` (or `True`) differ.
    """

    __slots__ = ("names", "treedef", "values", "_key")

    def __init__(
        self, names: tuple[str, ...], treedef: jtu.PyTreeDef, values: tuple[Any, ...]
    ):
        self.names = names
        self.treedef = treedef
        self.values = values
        self._key = (names, treedef, tuple((type(v), v) for v in values))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key


def _check_class(cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, _RAW_BASES)):
        kind = (
            f"an instance of {type(cls).__name__}"
            if isinstance(cls, _RAW_BASES)
            else repr(cls)
        )
        raise TypeError(
            f"FixedDistrax expects a distrax or TFP-JAX distribution or bijector "
            f"class as its first argument, got {kind}. Pass the class and its "
            "constructor arguments, e.g. "
            "`FixedDistrax(distrax.Normal, loc, scale)`."
        )
    if inspect.isabstract(cls) or cls in _RAW_BASES:
        raise TypeError(
            f"FixedDistrax({cls.__name__}): {_qualname(cls)} is abstract and "
            "cannot be instantiated; pass a concrete subclass."
        )


def _check_argument(cls: type, name: str, value: Any) -> None:
    """Reject constructor arguments that cannot live in a pytree."""
    where = f"FixedDistrax({cls.__name__}): argument `{name}`"
    for leaf in jtu.tree_leaves(value, is_leaf=lambda x: _is_dynamic(x) or _is_raw(x)):
        if _is_dynamic(leaf):
            continue
        if _is_raw(leaf):
            raise TypeError(
                f"{where} is a raw {_qualname(type(leaf))} instance, whose arrays "
                "would be hidden from JAX. Wrap it too: "
                f"`FixedDistrax({_qualname(type(leaf))}, ...)`."
            )
        try:
            hash(leaf)
        except TypeError:
            raise TypeError(
                f"{where} of type {type(leaf).__name__} is neither an array nor "
                "hashable, so it can be neither a leaf nor static. Pass it as a "
                "JAX/NumPy array, or as a hashable value."
            ) from None


class FixedDistrax(eqx.Module):
    """A distrax or TFP-JAX distribution or bijector as a proper PyTree.

    Holds the class (static) and its constructor arguments, and builds the
    underlying object afresh at every method call, which costs nothing after
    `jax.jit`. The leaves are exactly the array arguments given, so
    `eqx.filter_grad`, `eqx.partition`/`eqx.combine`, `eqx.tree_at`, `jax.jit`,
    `jax.vmap`, `lax.scan`, serialisation and optax all work.

    Arguments are split as follows:

    - arrays (JAX or NumPy) and nested `FixedDistrax` objects, also inside lists,
      tuples and dicts, are leaves;
    - everything else (Python ints, floats, bools, strings, `None`, dtypes,
      callables) is static and compared by value, so an equal wrapper built
      separately does not recompile. **Python floats are static too**, as in
      `eqx.filter_jit`: they are neither differentiated nor trained, and a different
      value compiles anew. Pass `jnp.asarray(1.0)` for a trainable parameter.

    Distributions forward `log_prob`, `prob`, `sample`, `sample_and_log_prob`,
    `mean`, `mode`, `variance`, `stddev`, `entropy`, `cdf`, `log_cdf`,
    `kl_divergence`, `cross_entropy`, `batch_shape`, `event_shape` and `dtype`.
    Bijectors forward `forward`, `inverse`, `forward_and_log_det`,
    `inverse_and_log_det`, `forward_log_det_jacobian`, `inverse_log_det_jacobian`
    and `__call__` (= `forward`), with one method set for distrax and TFP alike.
    Constructor arguments are readable by name (`dist.loc`, also inside
    `eqx.tree_at`); any other attribute falls through to the instantiated object.

    **Arguments:**

    - `cls`: a concrete distrax or TFP-JAX distribution or bijector class.
    - `*args`, `**kwargs`: its constructor arguments.

    **Raises:**

    `TypeError` if `cls` is not such a class or an argument can be neither a leaf
    nor static; `TypeError`/`ValueError` naming the class if it rejects the
    arguments (checked by building it once at construction).

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
    _leaves: tuple[Any, ...]
    _static: _Static = eqx.field(static=True)

    def __init__(self, cls: type, *args: Any, **kwargs: Any):
        _check_class(cls)
        try:
            bound = _signature(cls).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"FixedDistrax({cls.__name__}): {e}") from None
        arguments = dict(bound.arguments)
        for name, value in arguments.items():
            _check_argument(cls, name, value)
        # Flatten the values in signature order (a dict would be sorted by key).
        leaves, treedef = jtu.tree_flatten(
            list(arguments.values()), is_leaf=_is_dynamic
        )
        self.cls = cls
        self._leaves = tuple(x if _is_dynamic(x) else None for x in leaves)
        self._static = _Static(
            tuple(arguments),
            treedef,
            tuple(None if _is_dynamic(x) else x for x in leaves),
        )
        try:
            obj = self.instantiate()
            if self.is_distribution:  # distrax broadcasts lazily: force the check
                _ = (obj.batch_shape, obj.event_shape)
        except Exception as e:
            message = (
                f"FixedDistrax({cls.__name__}): {_qualname(cls)} rejected the "
                f"arguments ({', '.join(_items(arguments))}): {e}"
            )
            error = type(e) if isinstance(e, (TypeError, ValueError)) else ValueError
            raise error(message) from e

    # --- constructor arguments ------------------------------------------------

    @property
    def arguments(self) -> dict[str, Any]:
        """The constructor arguments by parameter name (nested wrappers kept)."""
        static = self._static
        leaves = [d if s is None else s for d, s in zip(self._leaves, static.values)]
        values = jtu.tree_unflatten(static.treedef, leaves)
        return dict(zip(static.names, values))

    def instantiate(self) -> Any:
        """Build the underlying distrax/TFP object, unwrapping nested wrappers.

        **Example:**

        ```python
        import distrax
        import jax.numpy as jnp
        import eqxprob as ep

        raw = ep.FixedDistrax(distrax.Normal, jnp.array(0.0), jnp.array(1.0))
        assert isinstance(raw.instantiate(), distrax.Normal)
        ```
        """
        arguments = jtu.tree_map(_unwrap, self.arguments, is_leaf=_is_wrapper)
        bound = inspect.BoundArguments(_signature(self.cls), arguments)
        return self.cls(*bound.args, **bound.kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: first the constructor arguments
        # (so `eqx.tree_at(lambda d: d.loc, ...)` works), then the built object.
        if name.startswith("__") or name in ("cls", "_leaves", "_static"):
            raise AttributeError(name)
        arguments = self.arguments
        if name in arguments:
            return arguments[name]
        return getattr(self.instantiate(), name)

    def __repr__(self) -> str:
        return (
            f"FixedDistrax({', '.join([self.cls.__name__, *_items(self.arguments)])})"
        )

    @property
    def is_distribution(self) -> bool:
        """Whether the wrapped class is a distribution (else a bijector)."""
        return issubclass(self.cls, _DISTRIBUTION_BASES)

    # --- distributions --------------------------------------------------------

    def log_prob(self, value: Any) -> Any:
        """Log density (or mass) of `value`."""
        return _call(self, True, "log_prob", _unwrap(value))

    def prob(self, value: Any) -> Any:
        """Density (or mass) of `value`."""
        return _call(self, True, "prob", _unwrap(value))

    def cdf(self, value: Any) -> Any:
        """Cumulative distribution function at `value`."""
        return _call(self, True, "cdf", value)

    def log_cdf(self, value: Any) -> Any:
        """Log of the cumulative distribution function at `value`."""
        return _call(self, True, "log_cdf", value)

    def sample(self, *, seed: Any, sample_shape: Any = ()) -> Any:
        """Draw samples of shape `sample_shape + batch_shape + event_shape`."""
        return _call(self, True, "sample", seed=seed, sample_shape=sample_shape)

    def sample_and_log_prob(self, *, seed: Any, sample_shape: Any = ()) -> Any:
        """Draw samples and return `(samples, log_prob(samples))`."""
        return _call(
            self, True, "sample_and_log_prob", seed=seed, sample_shape=sample_shape
        )

    def mean(self) -> Any:
        """The mean."""
        return _call(self, True, "mean")

    def mode(self) -> Any:
        """The mode."""
        return _call(self, True, "mode")

    def variance(self) -> Any:
        """The variance."""
        return _call(self, True, "variance")

    def stddev(self) -> Any:
        """The standard deviation."""
        return _call(self, True, "stddev")

    def entropy(self) -> Any:
        """The (differential) entropy."""
        return _call(self, True, "entropy")

    def kl_divergence(self, other: Any) -> Any:
        """KL(self || other); `other` may be wrapped or raw."""
        return _call(self, True, "kl_divergence", _unwrap(other))

    def cross_entropy(self, other: Any) -> Any:
        """Cross entropy of `other` relative to self; `other` may be wrapped."""
        return _call(self, True, "cross_entropy", _unwrap(other))

    @property
    def batch_shape(self) -> Any:
        """The batch shape, as a tuple for both distrax and TFP."""
        return _as_tuple(_get(self, "batch_shape"))

    @property
    def event_shape(self) -> Any:
        """The event shape, as a tuple for both distrax and TFP."""
        return _as_tuple(_get(self, "event_shape"))

    @property
    def dtype(self) -> Any:
        """The dtype of samples."""
        return _get(self, "dtype")

    # --- bijectors ------------------------------------------------------------

    def forward(self, x: Any) -> Any:
        """y = f(x)."""
        return _call(self, False, "forward", x)

    def inverse(self, y: Any) -> Any:
        """x = f⁻¹(y)."""
        return _call(self, False, "inverse", y)

    def forward_log_det_jacobian(self, x: Any) -> Any:
        """log|det J(f)(x)| (elementwise for scalar bijectors)."""
        return _call(self, False, "forward_log_det_jacobian", x)

    def inverse_log_det_jacobian(self, y: Any) -> Any:
        """log|det J(f⁻¹)(y)| (elementwise for scalar bijectors)."""
        return _call(self, False, "inverse_log_det_jacobian", y)

    def forward_and_log_det(self, x: Any) -> tuple[Any, Any]:
        """`(f(x), log|det J(f)(x)|)`, also for TFP bijectors."""
        return _call(self, False, "forward_and_log_det", x)

    def inverse_and_log_det(self, y: Any) -> tuple[Any, Any]:
        """`(f⁻¹(y), log|det J(f⁻¹)(y)|)`, also for TFP bijectors."""
        return _call(self, False, "inverse_and_log_det", y)

    def __call__(self, x: Any) -> Any:
        """Same as `forward`."""
        return _call(self, False, "forward", x)


# What distrax has and TFP lacks, written with TFP's own methods.
_TFP_FALLBACKS: dict[str, Callable[..., Any]] = {
    "sample_and_log_prob": lambda d, *, seed, sample_shape=(): (
        d.experimental_sample_and_log_prob(sample_shape=sample_shape, seed=seed)
    ),
    "forward_and_log_det": lambda b, x: (b.forward(x), b.forward_log_det_jacobian(x)),
    "inverse_and_log_det": lambda b, y: (b.inverse(y), b.inverse_log_det_jacobian(y)),
}


@contextlib.contextmanager
def _scoped_bijector_cache() -> Iterator[None]:
    """Give TFP's global bijector cache a fresh store for the duration of a call.

    TFP caches `forward`/`inverse` results keyed by the input object and by the
    bijector's *parameters*, in one store shared by all instances. On JAX, a call
    traced under `jit`/`scan` then leaves tracers in that store, and a later call
    with an equal bijector and the same concrete input returns a leaked tracer
    (`UnexpectedTracerError`). Scoping the store to one wrapper call keeps the
    cache's benefit within the call and drops it afterwards.
    """
    cache = vars(tfb.Bijector)["_cache"]  # the descriptor, not a bound copy
    saved = cache.storage
    cache.storage = type(saved)()
    try:
        yield
    finally:
        cache.storage = saved


# Module-level rather than methods: Equinox wraps every bound method of a Module
# in a Module of its own, which costs microseconds per eager call.
def _build(wrapper: FixedDistrax, distribution: bool, method: str) -> Any:
    """Instantiate `wrapper`, checking it is of the family `method` belongs to."""
    if wrapper.is_distribution != distribution:
        kind, other = (
            ("bijector", "distribution")
            if distribution
            else ("distribution", "bijector")
        )
        raise TypeError(
            f"FixedDistrax({wrapper.cls.__name__}) wraps a {kind}; `{method}` is "
            f"only available on a wrapped {other}."
        )
    return wrapper.instantiate()


def _call(
    wrapper: FixedDistrax, distribution: bool, method: str, *args: Any, **kwargs: Any
) -> Any:
    """Instantiate `wrapper` and call `method` on the result."""
    with _scoped_bijector_cache():
        obj = _build(wrapper, distribution, method)
        if not hasattr(obj, method):  # TFP lacks a few of distrax's methods
            return _TFP_FALLBACKS[method](obj, *args, **kwargs)
        return getattr(obj, method)(*args, **kwargs)


def _get(wrapper: FixedDistrax, name: str) -> Any:
    """Instantiate a wrapped distribution and read its property `name`."""
    with _scoped_bijector_cache():
        return getattr(_build(wrapper, True, name), name)


def _unwrap(x: Any) -> Any:
    """Instantiate `x` if it is a wrapper (recursively through its arguments)."""
    return x.instantiate() if _is_wrapper(x) else x


def _as_tuple(shape: Any) -> Any:
    if isinstance(shape, tfp.tf2jax.TensorShape):
        return tuple(shape.as_list())
    return shape


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
