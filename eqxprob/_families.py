"""The family adapters: everything eqxprob knows about distrax, TFP-JAX and numpyro.

`FixedDistrax` (in `_wrappers.py`) is family-agnostic: it asks `family_of(cls)` for the
adapter of a class and goes through it to read the constructor signature, build the
object, call methods (`Family.method` fills what a library lacks or misspells) and
read the uniform properties. Every decision about a class is made here, by the
class itself (its base classes, `Family.normal`), never by its name. Adding a fourth
family means writing one more `Family` subclass and listing it in `_FAMILIES`.
`Wrapped` declares what a wrapper is, for the modules below the wrapper.

numpyro is optional (`pip install -e '.[numpyro]'`): it is imported only when a
class or object from it is seen, which means the user has it; then wrappers are
registered with numpyro's `kl_divergence` and `vmap_over`, through their public
registration (the one place eqxprob registers with another library).

**TFP's bijector cache.** TFP caches bijector results in one store shared by all
instances, keyed by the *identity* of the input array. A call traced under
`jit`/`scan` leaves tracers in that store, and a later call with the same input
array object gets the leaked tracer back (`UnexpectedTracerError`), also in another
thread. So every array a wrapped call hands to an object of a family that
`caches_by_identity` is a fresh reference made for that call (`fresh`: a copy,
compiled away under `jit`); no other call can hit its cache entries.

**Private APIs relied upon** (each pinned by a test that fails naming it):
TFP's `parameter_properties.BIJECTOR_NOT_IMPLEMENTED` (continuous parameters, cast to
float when given as integer arrays); numpyro's `transforms._InverseTransform` (what
`t.inv` returns), refused as a class to wrap.
"""

from __future__ import annotations

import abc
import functools
import importlib
import inspect
import operator
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from tensorflow_probability.substrates import jax as tfp


tfd = tfp.distributions
tfb = tfp.bijectors


def require_numpyro() -> Any:
    """Import and return `numpyro.distributions` (wrappers registered with its
    dispatch the first time), or explain which extra to install.

    **Raises:**

    `ImportError` naming the `eqxprob[numpyro]` extra if numpyro is not installed.
    """
    try:
        module = importlib.import_module("numpyro.distributions")
    except ImportError as e:
        raise ImportError(
            "numpyro is an optional dependency of eqxprob: `pip install -e "
            f"'.[numpyro]'` from eqxprob's clone (or `pip install numpyro`). ({e})"
        ) from e
    _register_with_numpyro(module)
    return module


@functools.cache
def _register_with_numpyro(nd: Any) -> None:
    """numpyro's `kl_divergence` (multipledispatch) and `vmap_over`
    (singledispatch) take wrappers, through their public registration: a wrapper
    stands for the object it builds, so numpyro's own rule for the pair runs."""
    kl = importlib.import_module("numpyro.distributions.kl").kl_divergence
    vmap_over = importlib.import_module("numpyro.distributions.batch_util").vmap_over
    for pair in (
        (Wrapped, Wrapped),
        (Wrapped, nd.Distribution),
        (nd.Distribution, Wrapped),
    ):
        kl.add(pair, lambda p, q: kl(raw(p), raw(q)))
    vmap_over.register(Wrapped, _vmap_over)


def _vmap_over(wrapper: Wrapped, **axes: Any) -> Any:
    """numpyro's `vmap_over(d, loc=0, ...)`: the `in_axes` of `wrapper` for
    `jax.vmap`, its array arguments named in `axes` mapped, the rest `None`."""
    paths = jtu.tree_flatten_with_path(wrapper)[0]
    fields = sorted({path[0].name for path, _ in paths})
    if unknown := [name for name in axes if name not in fields]:
        raise TypeError(
            f"vmap_over(FixedDistrax({wrapper.cls.__name__}), ...): {unknown} not "
            f"among its array arguments {fields}."
        )
    return jtu.tree_map_with_path(lambda path, _: axes.get(path[0].name), wrapper)


def fresh(x: Any) -> Any:
    """A new reference to each JAX array in `x` (equal values; a tracer's copy is
    compiled away), for objects that cache by input identity."""
    return jtu.tree_map(lambda a: jnp.array(a, copy=True) if eqx.is_array(a) else a, x)


# ------------------------------------------------------------------------ adapters

_MISSING = object()  # (an argument that an instance does not keep)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def as_tuple(shape: Any) -> tuple[int, ...] | Any:
    if isinstance(shape, tfp.tf2jax.TensorShape):
        return tuple(shape.as_list())
    return tuple(shape) if isinstance(shape, list) else shape


class Wrapped(abc.ABC):
    """An object that stands for the library object it builds: `ep.FixedDistrax`.

    Declared here, below the wrapper, so that the modules the wrapper builds on
    (the transform protocol, prior supports) recognise one without importing it.
    """

    cls: type  # the class it builds

    @property
    @abc.abstractmethod
    def arguments(self) -> dict[str, Any]:
        """The constructor arguments by parameter name."""

    @abc.abstractmethod
    def instantiate(self) -> Any:
        """The library object."""


def raw(x: Any) -> Any:
    """The library object `x` stands for: a wrapper's, built; else `x` itself."""
    return x.instantiate() if isinstance(x, Wrapped) else x


class GaussianLayout(NamedTuple):
    """Where a Gaussian class keeps its parameters: `kind` is `"tri"` (a lower
    Cholesky factor of the covariance in `scale`, event shape `(d,)`) or `"diag"`
    (standard deviations in `scale`, elementwise with `loc`); `loc` and `scale`
    name the constructor arguments; `requires` lists `(argument, value)` pairs
    that the other arguments must equal (else it is another parameterisation)."""

    kind: str
    loc: str
    scale: str
    requires: tuple[tuple[str, Any], ...] = ()


class Family(abc.ABC):
    """How eqxprob talks to one library of distributions and bijectors.

    Abstract: a family implements `bases`, `normal`, `event_ndims_in` and either
    `argument` or `arguments_of`; the rest has defaults.
    """

    name: str = ""
    # Whether its objects keep a process-wide cache keyed by array identity, so
    # that every array given to them must be a fresh reference (see the module).
    caches_by_identity: bool = False
    # Whether `arguments_of` is the library's own contract (TFP's `.parameters`):
    # else a rebuild from it is accepted only if it holds the very same arrays.
    arguments_by_contract: bool = False

    # --- recognising classes and instances
    def owns(self, cls: type) -> bool:
        """Whether `cls` belongs to this library."""
        return issubclass(cls, self.bases())

    @abc.abstractmethod
    def bases(self) -> tuple[type, type]:
        """The base classes of the library's distributions and bijectors."""

    def is_distribution_class(self, cls: type) -> bool:
        return issubclass(cls, self.bases()[0])

    @abc.abstractmethod
    def normal(self) -> type:
        """The library's own univariate Normal class."""

    def gaussians(self) -> dict[type, GaussianLayout]:
        """The library's own Gaussian classes parameterised by a location and a
        scale (a lower Cholesky factor or standard deviations), by class: what
        natural gradients update. None by default."""
        return {}

    def abstract_reason(self, cls: type) -> str | None:
        # (distrax.Linear is abstract without saying so.)
        if inspect.isabstract(cls) or cls in (*self.bases(), distrax.Linear):
            return "is abstract and cannot be instantiated; pass a concrete subclass"
        return None

    def qualname(self, cls: type) -> str:
        return f"{self.name}.{cls.__name__}"

    # --- constructing
    def signature(self, cls: type) -> inspect.Signature:
        """The constructor signature without `self` (of `cls.__init__`: TFP hides
        it behind `(*args, **kwargs)` on the class)."""
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def static_floats(self, cls: type) -> frozenset[str]:
        """Arguments that must stay Python floats (the class branches on them)."""
        return frozenset()

    def prepare(self, cls: type, arguments: dict[str, Any]) -> dict[str, Any]:
        """Adjust constructor arguments once, at wrapping time."""
        return arguments

    def check_built(self, obj: Any) -> None:  # noqa: B027 - a no-op by default
        """Force validation a class may do lazily."""

    # --- calling: the uniform method set
    def call(self, obj: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `obj`'s `method`; a KL across numpyro and distrax/TFP is refused."""
        if method in ("kl_divergence", "cross_entropy") and args:
            _check_kl(self, obj, method, args[0])
        return self.method(obj, method)(*args, **kwargs)

    def method(self, obj: Any, name: str) -> Callable[..., Any]:
        """`obj`'s method `name`, or the family's own where its library lacks or
        spells it otherwise (the uniform set)."""
        return getattr(obj, name)

    def get(self, obj: Any, name: str) -> Any:
        if name == "event_ndims_in":
            return self.event_ndims_in(obj)
        return as_tuple(getattr(obj, name))  # (shapes as tuples; a dtype as it is)

    # --- raw instances
    def arguments_of(self, obj: Any) -> dict[str, Any]:
        """Constructor arguments recovered from an instance, or `TypeError`: by
        default each parameter's `argument` (a required one must be found)."""
        arguments = {}
        for name, p in self.signature(type(obj)).parameters.items():
            if (value := self.argument(obj, name, p)) is not _MISSING:
                arguments[name] = value
            elif p.default is p.empty and p.kind not in _VARIADIC:
                raise TypeError(f"cannot recover the argument `{name}`")
        return arguments

    def argument(self, obj: Any, name: str, p: inspect.Parameter) -> Any:
        """The constructor argument `name` (parameter `p`) as `obj` keeps it, or
        `_MISSING`; `TypeError` if it cannot be recovered at all."""
        return _MISSING

    @abc.abstractmethod
    def event_ndims_in(self, obj: Any) -> int | None:
        """The event dimensionality of a bijector's input, if known."""


class _Distrax(Family):
    name = "distrax"

    def bases(self) -> tuple[type, type]:
        return distrax.Distribution, distrax.Bijector

    def normal(self) -> type:
        return distrax.Normal

    def gaussians(self) -> dict[type, GaussianLayout]:
        return {
            # (`is_lower=False` makes `scale_tri` an upper factor: refused.)
            distrax.MultivariateNormalTri: GaussianLayout(
                "tri", "loc", "scale_tri", (("is_lower", True),)
            ),
            distrax.MultivariateNormalDiag: GaussianLayout("diag", "loc", "scale_diag"),
            distrax.Normal: GaussianLayout("diag", "loc", "scale"),
        }

    def static_floats(self, cls: type) -> frozenset[str]:
        # A spline's bounds are compared with each other in Python when it is built.
        spline = issubclass(cls, distrax.RationalQuadraticSpline)
        return frozenset({"range_min", "range_max", "min_bin_size"} if spline else ())

    def check_built(self, obj: Any) -> None:
        if isinstance(obj, distrax.Distribution):  # broadcasts lazily
            _ = (obj.batch_shape, obj.event_shape)

    def argument(self, obj: Any, name: str, p: inspect.Parameter) -> Any:
        if p.kind in _VARIADIC:
            raise TypeError(f"{name}: variadic constructor")
        # The private attribute first: public properties often broadcast.
        for attr in (f"_{name}", name):
            if attr in vars(obj) or hasattr(type(obj), attr):
                try:
                    return getattr(obj, attr)
                except Exception:  # noqa: BLE001 - a property that cannot
                    continue  # be computed: try the next spelling
        return _MISSING

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(getattr(obj, "event_ndims_in", None))


class _TFP(Family):
    name = "tfp"
    caches_by_identity = True
    arguments_by_contract = True

    def bases(self) -> tuple[type, type]:
        return tfd.Distribution, tfb.Bijector

    def normal(self) -> type:
        return tfd.Normal

    def gaussians(self) -> dict[type, GaussianLayout]:
        return {
            tfd.MultivariateNormalTriL: GaussianLayout("tri", "loc", "scale_tril"),
            tfd.MultivariateNormalDiag: GaussianLayout("diag", "loc", "scale_diag"),
            tfd.Normal: GaussianLayout("diag", "loc", "scale"),
        }

    def qualname(self, cls: type) -> str:
        return f"{'tfb' if issubclass(cls, tfb.Bijector) else 'tfd'}.{cls.__name__}"

    def prepare(self, cls: type, arguments: dict[str, Any]) -> dict[str, Any]:
        """Cast integer arrays given for continuous parameters to float.

        TFP takes its dtype from the arrays it is given, so
        `tfd.Normal(jnp.array(0), jnp.array(1)).log_prob(0.5)` computes in integers
        (and returns -0.125). Python ints are fine: TFP makes them floats itself.
        """
        of = lambda v, kind: eqx.is_array(v) and jnp.issubdtype(v.dtype, kind)
        floats = [v.dtype for v in jtu.tree_leaves(arguments) if of(v, jnp.floating)]
        dtype = jnp.result_type(*floats) if floats else jnp.result_type(float)
        out = dict(arguments)
        for name in _continuous_parameters(cls) & set(arguments):
            if eqx.is_array(value := arguments[name]) and not of(value, jnp.inexact):
                out[name] = jnp.asarray(value, dtype)
        return out

    def method(self, obj: Any, name: str) -> Callable[..., Any]:
        if name in _TFP_FALLBACKS and not hasattr(obj, name):
            return functools.partial(_TFP_FALLBACKS[name], obj)
        return super().method(obj, name)

    def arguments_of(self, obj: Any) -> dict[str, Any]:
        return dict(obj.parameters)

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(obj.forward_min_event_ndims)


def _check_kl(ours: Family, obj: Any, method: str, other: Any) -> None:
    """numpyro's KL registry and distrax/TFP's do not know each other's classes."""
    theirs = family_of_instance(other)
    if theirs not in (None, ours) and NUMPYRO in (ours, theirs):
        raise TypeError(
            f"{method}: the other distribution is a {theirs.qualname(type(other))} "  # pyright: ignore[reportOptionalMemberAccess]
            f"and this one a {ours.qualname(type(obj))}; numpyro's KL registry and "
            "distrax/TFP's do not know each other's classes. Wrap both from one "
            "library or write the KL from their parameters."
        )


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

    def owns(self, cls: type) -> bool:
        # (A class with a numpyro base: numpyro is imported, so asking imports
        # nothing. User subclasses included, as for distrax and TFP.)
        numpyro_base = any(c.__module__.startswith("numpyro.") for c in cls.__mro__)
        return numpyro_base and super().owns(cls)

    def bases(self) -> tuple[type, type]:
        return require_numpyro().Distribution, require_numpyro().transforms.Transform

    def normal(self) -> type:
        return require_numpyro().Normal

    def gaussians(self) -> dict[type, GaussianLayout]:
        nd = require_numpyro()
        # (Only through `scale_tril`: a covariance or precision matrix is refused.)
        only_tril = (("covariance_matrix", None), ("precision_matrix", None))
        return {
            nd.MultivariateNormal: GaussianLayout(
                "tri", "loc", "scale_tril", only_tril
            ),
            nd.Normal: GaussianLayout("diag", "loc", "scale"),
        }

    def static_floats(self, cls: type) -> frozenset[str]:
        dct = getattr(require_numpyro().transforms, "DiscreteCosineTransform", ())
        # (numpyro >= 0.22: `float(smooth)` when built.)
        return frozenset({"smooth"} if issubclass(cls, dct) else ())

    def abstract_reason(self, cls: type) -> str | None:
        transforms = require_numpyro().transforms
        if cls in (transforms.ParameterFreeTransform, transforms._InverseTransform):
            return "is not constructible by itself; pass a concrete transform"
        return super().abstract_reason(cls)

    def method(self, obj: Any, name: str) -> Callable[..., Any]:
        if name in _NUMPYRO_METHODS:
            return functools.partial(_NUMPYRO_METHODS[name], obj)
        return super().method(obj, name)  # the same spelling

    def get(self, obj: Any, name: str) -> Any:
        if name == "dtype":
            return jax.eval_shape(lambda: obj.sample(jax.random.PRNGKey(0))).dtype
        return super().get(obj, name)

    def argument(self, obj: Any, name: str, p: inspect.Parameter) -> Any:
        # (Parameter-free transforms take `(*args, **kwargs)`: skipped.)
        if p.kind in _VARIADIC or name == "validate_args":
            return _MISSING
        # `_name`: e.g. MixtureSameFamily's; `base_dist`: TransformedDistribution's.
        alias = "base_dist" if name == "base_distribution" else name
        found = [vars(obj)[a] for a in (name, f"_{name}", alias) if a in vars(obj)]
        return found[0] if found else _MISSING

    def event_ndims_in(self, obj: Any) -> int | None:
        return _as_int(getattr(getattr(obj, "domain", None), "event_dim", None))


def _np_sample(
    d: Any, key: Any = None, sample_shape: Any = (), *, seed: Any = None
) -> Any:
    """The uniform `sample(seed=, sample_shape=)`, or numpyro's own `sample(key,
    sample_shape)`; numpyro takes keys only (not Python ints), shapes as tuples."""
    if (key is None) == (seed is None):
        raise TypeError(
            "sample: pass one PRNG key, as `seed=key` or (numpyro's convention) "
            "first: `d.sample(key, sample_shape)`."
        )
    seed = key if seed is None else seed
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        seed = jax.random.PRNGKey(seed)
    integer = isinstance(sample_shape, (int, np.integer))
    shape = (int(sample_shape),) if integer else tuple(sample_shape)
    return d.sample(seed, shape)


def _np_kl(p: Any, q: Any) -> Any:
    return require_numpyro().kl.kl_divergence(p, q)


# The uniform methods numpyro lacks or spells differently; the rest (`log_prob`,
# `cdf`, `entropy`) are its own, as are its properties (`mean`, `variance`, `mode`).
_NUMPYRO_METHODS: dict[str, Callable[..., Any]] = {
    "prob": lambda d, x: jnp.exp(d.log_prob(x)),
    "log_cdf": lambda d, x: jnp.log(d.cdf(x)),
    "sample": _np_sample,
    "sample_and_log_prob": lambda d, *a, **kw: (
        x := _np_sample(d, *a, **kw),
        d.log_prob(x),
    ),
    "stddev": lambda d: jnp.sqrt(d.variance),
    "kl_divergence": _np_kl,
    "cross_entropy": lambda d, q: d.entropy() + _np_kl(d, q),
    "forward": lambda t, x: t(x),
    "inverse": lambda t, y: t.inv(y),
    "forward_log_det_jacobian": lambda t, x: t.log_abs_det_jacobian(x, t(x)),
    "inverse_log_det_jacobian": lambda t, y: -t.log_abs_det_jacobian(t.inv(y), y),
    "forward_and_log_det": lambda t, x: (y := t(x), t.log_abs_det_jacobian(x, y)),
    "inverse_and_log_det": lambda t, y: (x := t.inv(y), -t.log_abs_det_jacobian(x, y)),
}

_FAMILIES = DISTRAX, TFP, NUMPYRO = _Distrax(), _TFP(), _Numpyro()


def family_of(cls: Any) -> Family | None:
    """The adapter of a distribution or bijector class, or `None`."""
    families = _FAMILIES if isinstance(cls, type) else ()
    return next((family for family in families if family.owns(cls)), None)


def family_of_instance(x: Any) -> Family | None:
    """The adapter of a raw distribution or bijector instance, or `None`."""
    cls = type(x)  # numpyro's objects exist only once it is loaded: import nothing
    numpyro = cls.__module__.startswith("numpyro.")
    if numpyro and not sys.modules.get("numpyro.distributions"):
        return None
    return family_of(cls)


def is_raw_bijector(x: Any) -> bool:
    """Whether `x` is a distrax, TFP-JAX or numpyro bijector *instance*."""
    return bool((f := family_of_instance(x)) and issubclass(type(x), f.bases()[1]))


def is_raw(x: Any) -> bool:
    return family_of_instance(x) is not None


def normal_parameters(x: Any) -> tuple[Any, Any] | None:
    """`(loc, scale)` of `x` (raw or wrapped) if its class is one of the
    libraries' own univariate Normal classes, read from the built object (so they
    have the batch shape); `None` for any other class, a subclass included (it
    may override `log_prob`)."""
    obj = raw(x)
    family = family_of_instance(obj)
    if family is None or type(obj) is not family.normal():
        return None
    return obj.loc, obj.scale


def gaussian_layout(cls: Any) -> GaussianLayout | None:
    """The `GaussianLayout` of `cls` if it is one of the libraries' own Gaussian
    classes (by identity: a subclass may change what its arguments mean), else
    `None`."""
    family = family_of(cls)
    return None if family is None else family.gaussians().get(cls)


def _as_int(value: Any) -> int | None:
    try:
        return operator.index(value)
    except TypeError:
        return None
