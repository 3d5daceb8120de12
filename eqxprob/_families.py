"""Everything eqxprob knows about distrax, TFP-JAX and numpyro, one adapter per family.

`FixedDistrax` (in `_wrappers.py`) is family-agnostic: it asks `family_of(cls)` for the
adapter of a class and goes through it to read the constructor signature, build the
object and call the uniform method set. Adding a fourth family means writing one more
`Family` subclass and listing it in `_FAMILIES`.

numpyro is optional (`pip install 'eqxprob[numpyro]'`): it is imported only when a
class or object from it is seen, which means the user has it.

**Thread safety.** No function here mutates process-wide state. TFP caches bijector
results in one store shared by all instances, keyed by the *identity* of the input
array and by the bijector's parameters (by value). A call traced under `jit`/`scan`
leaves tracers in that store, and a later call with the same input array object and an
equal bijector gets the leaked tracer back (`UnexpectedTracerError`), also in another
thread. Instead of swapping TFP's store (which is global, and which another thread may
be using), every array that a wrapped call hands to an object of a caching family
is a *fresh reference* made for that call: a new `jax.Array` object sharing the
buffers of a concrete array, or `lax.copy_p` of a tracer (compiled away by XLA). A
cache entry made in one call is then keyed by an object nobody else ever sees, so no
other call can hit it; within one call the cache works as before.

**Private APIs relied upon** (each pinned by a test in `tests/test_families.py` that
fails with a message naming it when the upstream library changes):

- JAX: `jax._src.array.ArrayImpl(aval, sharding, arrays, committed=...,
  _skip_checks=True)` with `Array._arrays` and `Array._committed`, to make a fresh
  reference to a concrete array without copying it (about 2 µs). If it fails,
  `jax.device_put(x, may_alias=False)` (public, but a copy) is used instead.
- JAX: `jax._src.array.ArrayImpl` as the type of a concrete array (`CONCRETE`,
  for `type(x) is CONCRETE` fast paths), named rather than found from
  `type(jnp.zeros(()))`, which at import would start JAX's backend (after which
  `jax.config` can no longer choose the devices). If it moved, that is used.
- JAX: `jax.lax.copy_p` (exported, but a primitive rather than a documented
  function) for fresh tracers; it compiles away (same HLO, tested).
- numpyro: `numpyro.distributions.transforms._InverseTransform` (what `t.inv`
  returns), refused as a class to wrap.
- TFP: `tensorflow_probability.substrates.jax.internal.parameter_properties
  .BIJECTOR_NOT_IMPLEMENTED`, to tell continuous parameters (cast to float when given as
  integer arrays) from integer ones (`Permute.permutation`, `Binomial.total_count`).
- TFP: the behaviour described above of the bijector cache (keyed by input identity); a
  test checks that a fresh reference does not hit an entry made for the original.
- distrax: `wrap_instance` reads a constructor argument `name` from the private
  attribute `_name` (distrax stores most arguments so), else from `name`.
  The rebuilt object is checked to have the same leaves as the original.
- Equinox (in `_wrappers.py`): a `FixedDistrax` instance belongs to a subclass
  created per set of array-argument names (`type(eqx.Module)(...)`), assigned with
  `__class__` in `__init__` before any field is set; Equinox names key paths after
  fields and reads them from `__dict__` (pinned). `eqx.tree_at` probes `where` with
  leaves wrapped in the private `equinox._tree._LeafWrapper`, which is recognised to
  explain why a static argument cannot be replaced (pinned in `test_wrappers.py`).
  Printing uses the public wadler-lindig `__pdoc__` hook.
"""

from __future__ import annotations

import abc
import functools
import importlib
import inspect
import math
import operator
import sys
from collections.abc import Callable
from typing import Any, cast

import distrax
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from tensorflow_probability.substrates import jax as tfp


tfd = tfp.distributions
tfb = tfp.bijectors

NUMPYRO_HINT = (
    "numpyro is an optional dependency of eqxprob: install it with "
    "`pip install 'eqxprob[numpyro]'`."
)


def require_numpyro() -> Any:
    """Import and return `numpyro.distributions`, or explain which extra to install.

    **Raises:**

    `ImportError` naming the `eqxprob[numpyro]` extra if numpyro is not installed.

    **Example:**

    ```python
    from eqxprob._families import require_numpyro

    numpyro_distributions = require_numpyro()
    assert hasattr(numpyro_distributions, "Normal")
    ```
    """
    module = sys.modules.get("numpyro.distributions")
    if module is not None:  # imported already: the common case, ~0.1 µs
        return module
    try:
        return importlib.import_module("numpyro.distributions")
    except ImportError as e:
        raise ImportError(f"{NUMPYRO_HINT} ({e})") from e


# --------------------------------------------------------------- fresh references


def _concrete_type() -> type:
    try:
        from jax._src.array import ArrayImpl

        return ArrayImpl
    except ImportError:  # moved: ask JAX (this starts its backend)
        return type(jnp.zeros(()))


# The type of a concrete JAX array: `type(x) is CONCRETE` is the fast test the
# eager paths use first (tracers and NumPy arrays are not).
CONCRETE = _concrete_type()


def _alias_private(x: jax.Array) -> jax.Array:
    from jax._src.array import ArrayImpl

    # `jax.Array` declares neither attribute; its implementation `ArrayImpl` does.
    impl = cast(ArrayImpl, x)
    return ArrayImpl(
        x.aval, x.sharding, impl._arrays, committed=impl._committed, _skip_checks=True
    )


def _alias_public(x: jax.Array) -> jax.Array:
    return jax.device_put(x, may_alias=False)


def _check_alias(alias: Callable[[jax.Array], jax.Array]) -> bool:
    try:
        # (Concrete even when first used inside a trace, as it usually is.)
        with jax.ensure_compile_time_eval():
            x = jnp.arange(3.0)
            y = alias(x)
            same = bool((np.asarray(y) == np.asarray(x)).all())
        return y is not x and type(y) is type(x) and same
    except Exception:  # noqa: BLE001 - any failure means: use the public fallback
        return False


@functools.cache
def _alias_is_private() -> bool:
    """Whether the private path works (checked at the first use: at import it
    would start JAX's backend, after which `jax.config` cannot pick devices)."""
    return _check_alias(_alias_private)


def _alias(x: jax.Array) -> jax.Array:
    return _alias_private(x) if _alias_is_private() else _alias_public(x)


def fresh(x: Any) -> Any:
    """A new reference to the array `x`, equal in value; other objects unchanged.

    A tracer gives `lax.copy_p` of it (a new tracer, compiled away), a concrete
    `jax.Array` a new array object sharing its buffers; NumPy arrays and Python
    scalars are returned as they are (TFP converts them into new arrays itself).

    **Example:**

    ```python
    import jax.numpy as jnp
    from eqxprob._families import fresh

    x = jnp.arange(3.0)
    y = fresh(x)
    assert y is not x and (y == x).all()
    ```
    """
    if isinstance(x, jax.core.Tracer):
        return jax.lax.copy_p.bind(x)
    if isinstance(x, jax.Array):
        try:
            return _alias(x)
        except Exception:  # noqa: BLE001 - e.g. a typed PRNG key array
            return _alias_public(x)
    return x


def fresh_tree(tree: Any) -> Any:
    """`fresh` applied to every array leaf of `tree`."""
    if isinstance(tree, jax.Array):
        return fresh(tree)
    return jtu.tree_map(fresh, tree)


# ------------------------------------------------------------------------ adapters


def _as_tuple(shape: Any) -> tuple[int, ...] | Any:
    if isinstance(shape, tfp.tf2jax.TensorShape):
        return tuple(shape.as_list())
    if isinstance(shape, list):
        return tuple(shape)
    return shape


def _seed(seed: Any) -> Any:
    """A PRNG key from a key or a Python int (numpyro takes keys only)."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return jax.random.PRNGKey(seed)
    return seed


def _sample_shape(sample_shape: Any) -> tuple[int, ...]:
    if isinstance(sample_shape, int):
        return (sample_shape,)
    return tuple(sample_shape)


@functools.cache
def _init_signature(cls: type) -> inspect.Signature:
    """The constructor signature without `self`.

    TFP decorates `__init__` and hides it behind `(*args, **kwargs)` on the class,
    so read `cls.__init__` rather than `cls`.
    """
    signature = inspect.signature(cls.__init__)
    parameters = list(signature.parameters.values())[1:]
    return signature.replace(parameters=parameters)


class Family(abc.ABC):
    """How eqxprob talks to one library of distributions and bijectors.

    Abstract: a family implements `owns`, `distribution_base`, `bijector_base`,
    `arguments_of` and `event_ndims_in`; the rest has defaults.
    """

    name: str = ""
    # Whether its objects keep a process-wide cache keyed by array identity, so
    # that every array given to them must be a fresh reference (see the module).
    caches_by_identity: bool = False

    # --- recognising classes and instances
    @abc.abstractmethod
    def owns(self, cls: type) -> bool:
        """Whether `cls` belongs to this library."""

    @abc.abstractmethod
    def distribution_base(self) -> type:
        """The base class of the library's distributions."""

    @abc.abstractmethod
    def bijector_base(self) -> type:
        """The base class of the library's bijectors (transforms)."""

    def is_distribution_class(self, cls: type) -> bool:
        return issubclass(cls, self.distribution_base())

    def is_bijector_class(self, cls: type) -> bool:
        return issubclass(cls, self.bijector_base())

    def abstract_reason(self, cls: type) -> str | None:
        bases = (self.distribution_base(), self.bijector_base())
        if inspect.isabstract(cls) or cls in bases:
            return "is abstract and cannot be instantiated; pass a concrete subclass"
        return None

    def qualname(self, cls: type) -> str:
        return f"{self.name}.{cls.__name__}"

    # --- constructing
    def signature(self, cls: type) -> inspect.Signature:
        return _init_signature(cls)

    def static_floats(self, cls: type) -> frozenset[str]:
        """Arguments that must stay Python floats (the class branches on them)."""
        return frozenset()

    def prepare(self, cls: type, arguments: dict[str, Any]) -> dict[str, Any]:
        """Adjust constructor arguments once, at wrapping time."""
        return arguments

    def check_built(self, obj: Any) -> None:  # noqa: B027 - a no-op by default
        """Force validation a class may do lazily."""

    def unchecked(self, cls: type) -> dict[str, Any]:
        """Keyword arguments that build `cls` without checking argument values,
        for an object checked already: a nested wrapper, built again when its
        parent is checked. None by default."""
        return {}

    def validated(self, obj: Any) -> bool:
        """Whether building `obj` checked its arguments' values."""
        return False

    def checks_values(self, cls: type, static: dict[str, Any]) -> bool:
        """Whether building `cls` may check argument *values*, not only shapes
        and dtypes. When not, one successful build validates every later one
        with the same static arguments, shapes and dtypes (`FixedDistrax`
        caches that). Conservatively `True`."""
        return True

    def checks_traced(self, cls: type, static: dict[str, Any]) -> bool:
        """Whether building `cls` with these static arguments checks values now
        (with the library's current settings) by a test `traced_checks` can make
        under a trace. `False` by default: the build is checked eagerly."""
        return False

    def traced_checks(self, obj: Any) -> Any:
        """For `obj` built from traced arrays (in `jax.jit`) of a class that
        `checks_traced`: whether the value checks its library makes when
        building it from concrete arrays pass, as a traced boolean vector (a
        superset of them will do: a pass is then a pass, and a failure is
        checked eagerly); or `None` if they cannot be made under a trace. One
        compiled call then checks a build, where the library runs one eager op
        per test. Must not depend on the library's settings, which may change
        between the trace and a later call."""
        return None

    # --- calling: the uniform method set
    def call(self, obj: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(obj, method)(*args, **kwargs)

    def get(self, obj: Any, name: str) -> Any:
        value = getattr(obj, name)
        return _as_tuple(value) if name in ("batch_shape", "event_shape") else value

    # --- raw instances
    @abc.abstractmethod
    def arguments_of(self, obj: Any) -> dict[str, Any]:
        """Constructor arguments recovered from an instance, or `TypeError`."""

    @abc.abstractmethod
    def event_ndims_in(self, obj: Any) -> int | None:
        """The event dimensionality of a bijector's input, if known."""


class _Distrax(Family):
    name = "distrax"

    def owns(self, cls: type) -> bool:
        return issubclass(cls, (distrax.Distribution, distrax.Bijector))

    def distribution_base(self) -> type:
        return distrax.Distribution

    def bijector_base(self) -> type:
        return distrax.Bijector

    def abstract_reason(self, cls: type) -> str | None:
        if cls is distrax.Linear:
            return "is abstract and cannot be instantiated; pass a concrete subclass"
        return super().abstract_reason(cls)

    def static_floats(self, cls: type) -> frozenset[str]:
        if issubclass(cls, distrax.RationalQuadraticSpline):
            # Compared with each other in Python when the spline is built.
            return frozenset({"range_min", "range_max", "min_bin_size"})
        return frozenset()

    def check_built(self, obj: Any) -> None:
        if isinstance(obj, distrax.Distribution):  # broadcasts lazily
            _ = (obj.batch_shape, obj.event_shape)

    def checks_values(self, cls: type, static: dict[str, Any]) -> bool:
        return False  # distrax constructors check shapes only

    def arguments_of(self, obj: Any) -> dict[str, Any]:
        cls = type(obj)
        arguments = {}
        for name, p in self.signature(cls).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"{name}: variadic constructor")
            # The private attribute first: public properties often broadcast.
            for attr in (f"_{name}", name):
                if attr in vars(obj) or hasattr(type(obj), attr):
                    try:
                        arguments[name] = getattr(obj, attr)
                    except Exception:  # noqa: BLE001 - a property that cannot
                        continue  # be computed: try the next spelling
                    break
            else:
                if p.default is p.empty:
                    raise TypeError(f"cannot recover the argument `{name}`")
        return arguments

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(getattr(obj, "event_ndims_in", None))


class _TFP(Family):
    name = "tfp"
    caches_by_identity = True

    def owns(self, cls: type) -> bool:
        return issubclass(cls, (tfd.Distribution, tfb.Bijector))

    def distribution_base(self) -> type:
        return tfd.Distribution

    def bijector_base(self) -> type:
        return tfb.Bijector

    def qualname(self, cls: type) -> str:
        return f"{'tfb' if issubclass(cls, tfb.Bijector) else 'tfd'}.{cls.__name__}"

    def checks_values(self, cls: type, static: dict[str, Any]) -> bool:
        return bool(static.get("validate_args", False))  # TFP's assertions

    def unchecked(self, cls: type) -> dict[str, Any]:
        return _no_validation(self, cls)

    def validated(self, obj: Any) -> bool:
        return bool(getattr(obj, "validate_args", False))

    def prepare(self, cls: type, arguments: dict[str, Any]) -> dict[str, Any]:
        """Cast integer arrays given for continuous parameters to float.

        TFP takes its dtype from the arrays it is given, so
        `tfd.Normal(jnp.array(0), jnp.array(1)).log_prob(0.5)` computes in integers
        (and returns -0.125). Python ints are fine: TFP makes them floats itself.
        """
        continuous = _continuous_parameters(cls)
        floats = [
            v.dtype
            for v in jtu.tree_leaves(arguments)
            if eqx.is_array(v) and jnp.issubdtype(v.dtype, jnp.floating)
        ]
        dtype = jnp.result_type(*floats) if floats else jnp.result_type(float)
        out = dict(arguments)
        for name in continuous & set(arguments):
            value = arguments[name]
            if eqx.is_array(value) and not jnp.issubdtype(value.dtype, jnp.inexact):
                out[name] = jnp.asarray(value, dtype)
        return out

    def call(self, obj: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        fallback = _TFP_FALLBACKS.get(method)
        if fallback is not None and not hasattr(obj, method):
            return fallback(obj, *args, **kwargs)
        return getattr(obj, method)(*args, **kwargs)

    def arguments_of(self, obj: Any) -> dict[str, Any]:
        return dict(obj.parameters)

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(obj.forward_min_event_ndims)


@functools.cache
def _continuous_parameters(cls: type) -> frozenset[str]:
    from tensorflow_probability.substrates.jax.internal import parameter_properties

    try:
        properties = cls.parameter_properties()
    except Exception:  # noqa: BLE001 - not implemented by every class
        return frozenset()
    not_implemented = parameter_properties.BIJECTOR_NOT_IMPLEMENTED
    names = {
        name
        for name, p in properties.items()
        if p.default_constraining_bijector_fn is not not_implemented
    }
    if issubclass(cls, tfd.FiniteDiscrete):
        names.discard("outcomes")  # integer outcomes are meaningful
    return frozenset(names)


def _no_validation(family: Family, cls: type) -> dict[str, Any]:
    """`validate_args=False`, for a class (TFP, numpyro) that takes it."""
    parameters = family.signature(cls).parameters
    return {"validate_args": False} if "validate_args" in parameters else {}


# What distrax has and TFP lacks, written with TFP's own methods.
_TFP_FALLBACKS: dict[str, Callable[..., Any]] = {
    "sample_and_log_prob": lambda d, *, seed, sample_shape=(): (
        d.experimental_sample_and_log_prob(sample_shape=sample_shape, seed=seed)
    ),
    "forward_and_log_det": lambda b, x: (b.forward(x), b.forward_log_det_jacobian(x)),
    "inverse_and_log_det": lambda b, y: (b.inverse(y), b.inverse_log_det_jacobian(y)),
}


class _Numpyro(Family):
    """numpyro: `mean`/`variance` are properties, `sample(key, shape)`, transforms
    are called and have `inv` and `log_abs_det_jacobian(x, y)`."""

    name = "numpyro"

    @staticmethod
    def _loaded() -> bool:
        return sys.modules.get("numpyro.distributions") is not None

    def owns(self, cls: type) -> bool:
        if not cls.__module__.startswith("numpyro."):
            return False
        nd = require_numpyro()
        return issubclass(cls, (nd.Distribution, nd.transforms.Transform))

    def distribution_base(self) -> type:
        return require_numpyro().Distribution

    def bijector_base(self) -> type:
        return require_numpyro().transforms.Transform

    def static_floats(self, cls: type) -> frozenset[str]:
        if issubclass(cls, require_numpyro().transforms.DiscreteCosineTransform):
            return frozenset({"smooth"})  # `float(smooth)` when built
        return frozenset()

    def checks_values(self, cls: type, static: dict[str, Any]) -> bool:
        # Distributions validate their arguments unless told not to (numpyro's
        # default is on); transforms never do.
        return (
            self.is_distribution_class(cls) and static.get("validate_args") is not False
        )

    def unchecked(self, cls: type) -> dict[str, Any]:
        return _no_validation(self, cls)

    def validated(self, obj: Any) -> bool:
        # A distribution's `_validate_args`: its `validate_args` argument, or
        # numpyro's global default (`numpyro.enable_validation`) when not given.
        return self.is_distribution_class(type(obj)) and bool(obj._validate_args)

    def checks_traced(self, cls: type, static: dict[str, Any]) -> bool:
        # Validation on: the `validate_args` argument, else numpyro's global
        # default (`numpyro.enable_validation`).
        if not self.is_distribution_class(cls):
            return False
        validate = static.get("validate_args")
        if validate is None:
            validate = require_numpyro().Distribution._validate_args
        return bool(validate)

    def traced_checks(self, obj: Any) -> Any:
        # numpyro checks values in `Distribution.validate_args`, called by
        # `Distribution.__init__` and skipped for traced values: each argument
        # `get_args` lists against its `arg_constraints` entry, dependent ones
        # skipped. Made here for `obj` and every distribution it holds, as built
        # by its `__init__` (`Wishart`'s `WishartCholesky`, `LKJCholesky`'s
        # `Beta`...), whether or not its validation is on (read under the trace,
        # that may be another thread's setting of the moment); `None` if one of
        # them overrides `validate_args`.
        nd = require_numpyro()
        is_dependent = nd.constraints.is_dependent
        checks = []
        for d in _held_distributions(obj, nd.Distribution):
            if type(d).validate_args is not nd.Distribution.validate_args:
                return None
            checks += [
                jnp.all(d.arg_constraints[name](value))
                for name, value in d.get_args().items()
                if not is_dependent(d.arg_constraints[name])
            ]
        return jnp.stack(checks) if checks else jnp.ones((0,), bool)

    def abstract_reason(self, cls: type) -> str | None:
        nd = require_numpyro()
        abstract = (
            nd.transforms.ParameterFreeTransform,
            nd.transforms._InverseTransform,
        )
        if cls in abstract:
            return "is not constructible by itself; pass a concrete transform"
        return super().abstract_reason(cls)

    def call(self, obj: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return _NUMPYRO_METHODS[method](obj, *args, **kwargs)

    def get(self, obj: Any, name: str) -> Any:
        if name == "dtype":
            key = jax.random.PRNGKey(0)
            return jax.eval_shape(lambda: obj.sample(key)).dtype
        return super().get(obj, name)

    def arguments_of(self, obj: Any) -> dict[str, Any]:
        cls = type(obj)
        arguments = {}
        for name, p in self.signature(cls).parameters.items():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue  # parameter-free transforms: `(*args, **kwargs)`
            if name == "validate_args":
                continue
            if name in vars(obj):
                arguments[name] = vars(obj)[name]
            elif f"_{name}" in vars(obj):  # e.g. MixtureSameFamily's
                arguments[name] = vars(obj)[f"_{name}"]
            elif name == "base_distribution" and "base_dist" in vars(obj):
                arguments[name] = obj.base_dist
            elif p.default is p.empty:
                raise TypeError(f"cannot recover the argument `{name}`")
        return arguments

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(getattr(getattr(obj, "domain", None), "event_dim", None))


def _held_distributions(obj: Any, base: type) -> list[Any]:
    """`obj` and the distributions (instances of `base`) it holds, at any depth
    of their attributes, lists, tuples and dicts; each once."""
    found: dict[int, Any] = {}

    def visit(x: Any) -> None:
        if isinstance(x, base):
            if id(x) in found:
                return
            found[id(x)] = x
            x = list(vars(x).values())
        if isinstance(x, dict):
            x = list(x.values())
        if isinstance(x, (list, tuple)):
            for y in x:
                visit(y)

    visit(obj)
    return list(found.values())


def _np_forward_ldj(t: Any, x: Any) -> Any:
    return t.log_abs_det_jacobian(x, t(x))


def _np_inverse_and_log_det(t: Any, y: Any) -> tuple[Any, Any]:
    x = t.inv(y)
    return x, -t.log_abs_det_jacobian(x, y)


def _np_forward_and_log_det(t: Any, x: Any) -> tuple[Any, Any]:
    y = t(x)
    return y, t.log_abs_det_jacobian(x, y)


def _np_mode(d: Any) -> Any:
    try:
        return d.mode
    except AttributeError:  # numpyro < 0.22 lacks the property altogether
        raise NotImplementedError(
            f"numpyro.{type(d).__name__} does not implement `mode`."
        ) from None


def _np_kl(p: Any, q: Any) -> Any:
    return require_numpyro().kl.kl_divergence(p, q)


def _np_sample(d: Any, *, seed: Any, sample_shape: Any = ()) -> Any:
    return d.sample(_seed(seed), _sample_shape(sample_shape))


def _np_sample_and_log_prob(d: Any, *, seed: Any, sample_shape: Any = ()) -> Any:
    x = _np_sample(d, seed=seed, sample_shape=sample_shape)
    return x, d.log_prob(x)


_NUMPYRO_METHODS: dict[str, Callable[..., Any]] = {
    "log_prob": lambda d, x: d.log_prob(x),
    "prob": lambda d, x: jnp.exp(d.log_prob(x)),
    "cdf": lambda d, x: d.cdf(x),
    "log_cdf": lambda d, x: jnp.log(d.cdf(x)),
    "sample": _np_sample,
    "sample_and_log_prob": _np_sample_and_log_prob,
    "mean": lambda d: d.mean,
    "mode": lambda d: _np_mode(d),
    "variance": lambda d: d.variance,
    "stddev": lambda d: jnp.sqrt(d.variance),
    "entropy": lambda d: d.entropy(),
    "kl_divergence": _np_kl,
    "cross_entropy": lambda d, q: d.entropy() + _np_kl(d, q),
    "forward": lambda t, x: t(x),
    "inverse": lambda t, y: t.inv(y),
    "forward_log_det_jacobian": _np_forward_ldj,
    "inverse_log_det_jacobian": lambda t, y: _np_inverse_and_log_det(t, y)[1],
    "forward_and_log_det": _np_forward_and_log_det,
    "inverse_and_log_det": _np_inverse_and_log_det,
}

DISTRAX, TFP, NUMPYRO = _Distrax(), _TFP(), _Numpyro()
_FAMILIES: tuple[Family, ...] = (DISTRAX, TFP, NUMPYRO)


def family_of(cls: Any) -> Family | None:
    """The adapter of a distribution or bijector class, or `None`."""
    if not isinstance(cls, type):
        return None
    for family in _FAMILIES:
        if family.owns(cls):
            return family
    return None


def family_of_instance(x: Any) -> Family | None:
    """The adapter of a raw distribution or bijector instance, or `None`."""
    cls = type(x)
    if cls.__module__.startswith("numpyro.") and not NUMPYRO._loaded():
        return None
    return family_of(cls)


# ---------------------------------------------------------------- public helpers


def is_raw_distribution(x: Any) -> bool:
    """Whether `x` is a distrax, TFP-JAX or numpyro distribution *instance*.

    **Example:**

    ```python
    import distrax
    from eqxprob._families import is_raw_distribution

    assert is_raw_distribution(distrax.Normal(0.0, 1.0))
    assert not is_raw_distribution(distrax.Normal)
    ```
    """
    family = family_of_instance(x)
    return family is not None and family.is_distribution_class(type(x))


def is_raw_bijector(x: Any) -> bool:
    """Whether `x` is a distrax, TFP-JAX or numpyro bijector (transform) *instance*.

    **Example:**

    ```python
    from tensorflow_probability.substrates import jax as tfp
    from eqxprob._families import is_raw_bijector

    assert is_raw_bijector(tfp.bijectors.Exp())
    ```
    """
    family = family_of_instance(x)
    return family is not None and family.is_bijector_class(type(x))


def is_raw(x: Any) -> bool:
    return is_raw_distribution(x) or is_raw_bijector(x)


def _leaves_match(a: Any, b: Any) -> bool:
    """Whether two raw objects flatten to equal arrays (concrete ones by value)."""
    try:
        la, lb = jtu.tree_leaves(a), jtu.tree_leaves(b)
    except Exception:  # noqa: BLE001
        return False
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if not all(map(_is_numeric, (x, y))):
            if x is not y and x != y:
                return False
            continue
        if jnp.shape(x) != jnp.shape(y) or jnp.result_type(x) != jnp.result_type(y):
            return False
        if isinstance(x, jax.core.Tracer) or isinstance(y, jax.core.Tracer):
            continue
        if not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True):
            return False
    return True


def _is_numeric(x: Any) -> bool:
    return eqx.is_array(x) or type(x) in (int, float, bool, complex)


def _as_int(value: Any) -> int | None:
    try:
        return operator.index(value)
    except TypeError:
        return None


def wrap_instance(obj: Any) -> Any:
    """Rebuild a raw distribution or bijector instance of any family as a
    `FixedDistrax`.

    TFP objects are rebuilt from their `.parameters`, numpyro and distrax ones from
    the attributes that hold their constructor arguments; nested raw objects are
    rebuilt recursively. A distrax or numpyro rebuild is checked to flatten to the
    same arrays as the original.

    **Arguments:**

    - `obj`: a distrax, TFP-JAX or numpyro distribution or bijector instance (a
      `FixedDistrax` is returned unchanged).

    **Returns:**

    An equivalent `FixedDistrax`.

    **Raises:**

    `TypeError` naming the class if `obj` is not such an instance, or if its
    constructor arguments cannot be recovered faithfully: then wrap the class
    yourself, `ep.FixedDistrax(distrax.X, ...)`.

    **Example:**

    ```python
    import jax.numpy as jnp
    from tensorflow_probability.substrates import jax as tfp
    from eqxprob._families import wrap_instance

    wrapped = wrap_instance(tfp.bijectors.Shift(jnp.array(2.0)))
    assert wrapped.forward(1.0) == 3.0
    ```
    """
    from ._wrappers import FixedDistrax

    if isinstance(obj, FixedDistrax):
        return obj
    family = family_of_instance(obj)
    cls = type(obj)
    if family is None or not (
        family.is_distribution_class(cls) or family.is_bijector_class(cls)
    ):
        raise TypeError(
            f"wrap_instance expects a distrax, TFP-JAX or numpyro distribution or "
            f"bijector instance, got {obj!r}."
        )
    how = (
        f"Wrap it yourself: `ep.FixedDistrax({family.qualname(cls)}, ...)` with its "
        "constructor arguments."
    )
    try:
        arguments = family.arguments_of(obj)
    except TypeError as e:
        raise TypeError(
            f"Cannot rebuild the raw {family.qualname(cls)} from its attributes "
            f"({e}). {how}"
        ) from None
    arguments = jtu.tree_map(
        lambda x: wrap_instance(x) if is_raw(x) else x, arguments, is_leaf=is_raw
    )
    try:
        wrapped = FixedDistrax(cls, **arguments)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"Cannot rebuild the raw {family.qualname(cls)} from its attributes: "
            f"{e}. {how}"
        ) from None
    if family is not TFP and not _leaves_match(wrapped.instantiate(), obj):
        raise TypeError(
            f"Cannot rebuild the raw {family.qualname(cls)} faithfully from its "
            f"attributes (the rebuilt object holds different arrays). {how}"
        )
    return wrapped


def event_ndims_in(bijector: Any) -> int | None:
    """How many trailing dimensions a bijector's forward log-det consumes.

    TFP's `forward_min_event_ndims`, distrax's `event_ndims_in`, numpyro's
    `domain.event_dim`.

    **Arguments:**

    - `bijector`: a `FixedDistrax` bijector or a raw bijector of any family.

    **Returns:**

    An `int`, or `None` if unknown (e.g. a structured TFP bijector, or not a
    bijector).

    **Example:**

    ```python
    import distrax
    from tensorflow_probability.substrates import jax as tfp
    import eqxprob as ep
    from eqxprob._families import event_ndims_in

    assert event_ndims_in(tfp.bijectors.Exp()) == 0
    assert event_ndims_in(ep.FixedDistrax(tfp.bijectors.FillScaleTriL)) == 1
    assert event_ndims_in(distrax.Tanh()) == 0
    ```
    """
    from ._wrappers import FixedDistrax

    if isinstance(bijector, FixedDistrax):
        if bijector.is_distribution:
            return None
        family, obj = bijector.family, bijector.instantiate()
    else:
        family = family_of_instance(bijector)
        if family is None or not family.is_bijector_class(type(bijector)):
            return None
        obj = bijector
    return family.event_ndims_in(obj)


def float_key(value: Any) -> Any:
    """A hashable key that tells apart what `==` confuses: `1`, `1.0`, `True`,
    `0.0` and `-0.0`; NaN equals NaN."""
    if type(value) is float:
        return (float, value.hex() if not math.isnan(value) else "nan")
    if type(value) in (tuple, list):
        return (type(value), tuple(map(float_key, value)))
    if type(value) is dict:
        return (dict, tuple((k, float_key(v)) for k, v in value.items()))
    return (type(value), value)
