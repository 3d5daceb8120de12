"""Constraints: the support a parameter must lie in, and its default bijector.

A `Constraint` owns everything about its support: `check` (with one tolerance per
dtype, `tolerance`), its event dimensionality, the message that says how to fix a
value outside it, and its default bijector (`bijector`). The
shortcuts (`ep.positive`, ...) and the registry (`ep.field(constraint=...)`) both
call `validate` and `default_bijector` here, so there is one rule per constraint,
and store every bijector through `as_transform` here (a raw library bijector becomes
an `ep.FixedDistrax`: the parameter layer sits above the wrapper, the transform
protocol below it).

**Where to add a constraint:** one subclass of `Constraint` in this file (or your
own), with `check`, `fix` and `bijector` (the built-in transforms live in
`_transforms.py`), plus its export line in `constraints.py`.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable
from typing import Any, ClassVar

import distrax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from . import _errors, _families, _transforms
from ._static import Const
from ._wrappers import FixedDistrax


class Constraint(abc.ABC):
    """Base class of constraints: the support a parameter must lie in.

    Subclass it, implement `check` and `bijector` (the default bijector), and
    set `event_ndim` if the constraint is about vectors (1) or matrices (2)
    rather than single numbers (0): that one class is the whole constraint.

    **Example:**

    ```python
    import jax.numpy as jnp
    from tensorflow_probability.substrates.jax import bijectors as tfb
    import eqxprob as ep

    class Negative(ep.constraints.Constraint):
        def check(self, value):
            return (value < 0) & jnp.isfinite(value)

        def bijector(self):
            return tfb.Chain([tfb.Scale(-1.0), tfb.Exp()])

    assert bool(Negative().check(jnp.array(-1.0)))
    assert ep.default_bijector(Negative()).forward(jnp.array(0.0)) == -1.0
    node = ep.Bijector.from_value(-2.0, constraint=Negative())
    ```
    """

    event_ndim: ClassVar[int] = 0
    fix: ClassVar[str] = "Initialise the parameter inside the support."

    @abc.abstractmethod
    def check(self, value: Float[Array, "*shape"]) -> Bool[Array, "*batch"]:
        """Boolean array of the batch shape (`value.shape` without the last
        `event_ndim` axes): is each value (vector, matrix) in the support?"""

    def bijector(self) -> Any:
        """The default bijector from unconstrained space onto the support, or
        `None` (then `ep.register_bijector` may give one). Its
        `forward_log_det_jacobian` is the density correction with respect to
        the constraint's own measure (for matrices: the free entries)."""
        return None

    def _shape_error(self, shape: tuple[int, ...]) -> str | None:
        """Why an array of `shape` cannot be in the support at all, or `None`."""
        enough = len(shape) >= self.event_ndim
        return None if enough else f"needs at least {self.event_ndim} dimension(s)"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and _key(self) == _key(other)

    def __hash__(self) -> int:
        return hash((type(self), _key(self)))

    def __repr__(self) -> str:
        return f"constraints.{type(self).__name__}()"


def _key(constraint: object) -> tuple:
    return tuple(
        (k, np.asarray(v).tobytes(), np.shape(v)) for k, v in vars(constraint).items()
    )


def holds(constraint: Constraint, value: Any) -> Any:
    """`constraint.check(value)`, concrete or traced."""
    return constraint.check(jnp.asarray(value))


def validate(constraint: Constraint, value: Array, name: str) -> Array:
    """Return `value`, or raise `ValueError` naming `name` if it is outside
    `constraint` (an `eqx.error_if` with the same message under `jit`)."""
    shape = tuple(np.shape(value))
    problem = constraint._shape_error(shape)
    if problem is not None:
        raise ValueError(
            f"{name}: {constraint!r} {problem}, but the value has shape {shape}."
        )
    ok = holds(constraint, value)
    batch = shape[: len(shape) - constraint.event_ndim]
    if not _errors.broadcasts_to(np.shape(ok), batch):
        raise TypeError(
            f"{type(constraint).__name__}.check returned shape {np.shape(ok)} for a "
            f"value of shape {shape}; it must return {batch}, one flag per event."
        )
    what = f"{name}: the value must lie in {constraint!r}"
    return _errors.check(value, ~ok, what, constraint.fix)


# --- built-in constraints ---------------------------------------------------------


class _BuiltIn(Constraint):
    """A built-in constraint: `_test` on `jnp.asarray(value)`, and `repr` naming
    the module's instance (`constraints.lower_cholesky`)."""

    def check(self, value: Float[Array, "*shape"]) -> Bool[Array, "*batch"]:
        return self._test(jnp.asarray(value))

    @abc.abstractmethod
    def _test(self, v: Array) -> Array: ...

    def __repr__(self) -> str:  # `constraints.positive`, `constraints.interval(0, 1)`
        # (Named after the built-in class, also for a user's subclass of one.)
        ours = next(c for c in type(self).__mro__ if c.__module__ == __name__)
        attrs = vars(self)
        bounds = [_errors.short(attrs[k]) for k in ("low", "high") if k in attrs]
        args = f"({', '.join(bounds)})" if bounds else ""
        return f"constraints.{_snake(ours.__name__)}{args}"


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Real(_BuiltIn):
    """Finite real numbers (NaN and ±inf are outside)."""

    fix = "Pass finite values."

    def _test(self, v):
        return jnp.isfinite(v)

    def bijector(self) -> Any:
        return _transforms.Identity()


class Positive(_BuiltIn):
    """Finite values `> 0`."""

    fix = "Pass finite values > 0, e.g. `jnp.maximum(value, 1e-6)`."

    def _test(self, v):
        return (v > 0) & (v < jnp.inf)

    def bijector(self) -> Any:
        return _transforms.Softplus()


class Nonnegative(_BuiltIn):
    """Finite values `>= 0` (zero included, as GPJax's `NonNegativeReal`)."""

    fix = "Pass finite values >= 0."

    def _test(self, v):
        return (v >= 0) & (v < jnp.inf)

    def bijector(self) -> Any:
        return _transforms.Softplus(floor=True)


_ONE_SIDED = (
    "For a one-sided support use `ep.constraints.interval(low, jnp.inf)` (which is "
    "`greater_than(low)`) or `less_than(high)`."
)


def _bounds(what: str, **bounds: Any) -> list[Any]:
    """Real, finite bounds (and `low < high` when both are given): NumPy values
    on the host, or traced ones with `eqx.error_if`s attached (keep them)."""
    out: dict[str, Any] = {}
    for name, b in bounds.items():
        if not _errors.is_traced(b):
            a = np.asarray(b)
            if np.iscomplexobj(a) or not np.issubdtype(a.dtype, np.number):
                raise TypeError(f"{what}: `{name}` must be a real number, got {a!r}.")
            b: Any = a[()] if a.ndim == 0 else a
        must = f"{what}: `{name}` must be finite"
        out[name] = _errors.check_finite(b, must, _ONE_SIDED, (name, b))
    if len(out) == 2:
        low, high = out["low"], out["high"]
        bad = ~(_errors.host(low) < _errors.host(high))
        must = f"{what}: `low` must be smaller than `high`"
        shown = f"(low, high) = ({_errors.short(low)}, {_errors.short(high)})"
        out["low"] = _errors.check(low, bad, must, "Swap or fix the bounds.", shown)
    return list(out.values())


def _common(*xs: Any) -> list[Array]:
    """The value and its bounds in one dtype, the wider (as NumPy compares)."""
    dtype = np.result_type(*(x.dtype for x in xs))
    return [jnp.asarray(x, jax.dtypes.canonicalize_dtype(dtype)) for x in xs]


class GreaterThan(_BuiltIn):
    """Finite values `> low`."""

    fix = "Pass finite values above the lower bound."

    def __init__(self, low: ArrayLike):
        [self.low] = _bounds("constraints.greater_than", low=low)

    def _test(self, v):
        v, low = _common(v, self.low)
        return (v > low) & (v < jnp.inf)

    def bijector(self) -> Any:
        return _transforms.SoftplusFrom(self.low, 1.0)


class LessThan(_BuiltIn):
    """Finite values `< high`."""

    fix = "Pass finite values below the upper bound."

    def __init__(self, high: ArrayLike):
        [self.high] = _bounds("constraints.less_than", high=high)

    def _test(self, v):
        v, high = _common(v, self.high)
        return (v < high) & (v > -jnp.inf)

    def bijector(self) -> Any:
        return _transforms.SoftplusFrom(self.high, -1.0)


class Interval(_BuiltIn):
    """The open interval `(low, high)`, finite bounds with `low < high`
    (broadcastable arrays allowed). Use `interval(low, high)`, which also accepts
    an infinite bound."""

    fix = "The interval is open: move the value inside, or widen the bounds."

    def __init__(self, low: ArrayLike, high: ArrayLike):
        self.low, self.high = _bounds("constraints.interval", low=low, high=high)

    def _test(self, v):
        v, low, high = _common(v, self.low, self.high)
        return (v > low) & (v < high)

    def bijector(self) -> Any:
        return _transforms.Sigmoid(self.low, self.high)


def _tolerance(v: Array) -> float:
    """`tolerance` of `v`'s dtype (of float32 for integers)."""
    floating = jnp.issubdtype(v.dtype, jnp.floating)
    return _errors.tolerance(v.dtype if floating else jnp.float32)


class Simplex(_BuiltIn):
    """Vectors of positive entries summing to 1 along the last axis (the open
    simplex), the sum within `tolerance(dtype)`."""

    event_ndim = 1
    fix = (
        "Entries must be > 0 and sum to 1: normalise with "
        "`value / value.sum(-1, keepdims=True)`, and mix in a little of the uniform "
        "distribution for zeros: `(1 - eps) * value + eps / n`."
    )

    def _test(self, v):
        positive = jnp.all((v > 0) & (v < jnp.inf), axis=-1)
        return positive & (jnp.abs(jnp.sum(v, axis=-1) - 1) <= _tolerance(v))

    def _shape_error(self, shape):
        return "needs a last axis of size >= 1" if not shape or shape[-1] < 1 else None

    def bijector(self) -> Any:
        return _transforms.SoftmaxCentered()


class _Square(_BuiltIn):
    """A constraint on square matrices."""

    event_ndim = 2

    def _shape_error(self, shape):
        square = len(shape) >= 2 and shape[-1] == shape[-2]
        return None if square else "needs square matrices, shape (..., n, n)"


def _triangular(v: Array) -> Array:
    """Lower-triangular with a finite, positive diagonal (one flag per matrix)."""
    finite = jnp.all(jnp.isfinite(v), axis=(-2, -1))
    zero_above = jnp.all(jnp.triu(v, 1) == 0, axis=(-2, -1))
    diagonal = jnp.diagonal(v, axis1=-2, axis2=-1)
    return finite & zero_above & jnp.all(diagonal > 0, axis=-1)


class LowerCholesky(_Square):
    """Lower-triangular square matrices with a finite, positive diagonal (Cholesky
    factors of covariance matrices)."""

    fix = (
        "Pass `jnp.linalg.cholesky(cov)`; negate each column whose diagonal entry is "
        "negative (`L @ L.T` is unchanged) and zero the upper triangle."
    )

    def _test(self, v):
        return _triangular(v)

    def bijector(self) -> Any:
        return _transforms.LowerCholesky()


class CorrCholesky(_Square):
    """Cholesky factors of correlation matrices: lower-triangular, positive
    diagonal, rows of unit Euclidean norm (within `tolerance(dtype)`); the support
    of an LKJ prior."""

    fix = (
        "Pass `jnp.linalg.cholesky(corr)` of a correlation matrix (unit diagonal), "
        "or normalise each row of a Cholesky factor to unit norm."
    )

    def _test(self, v):
        norms = jnp.sum(jnp.where(jnp.isfinite(v), v, 0) ** 2, axis=-1)
        unit = jnp.all(jnp.abs(norms - 1) <= _tolerance(v), axis=-1)
        return _triangular(v) & unit

    def bijector(self) -> Any:
        return _transforms.CorrCholesky()


class PositiveDefinite(_Square):
    """Symmetric positive-definite matrices (covariance matrices): symmetric within
    `tolerance(dtype)` relative to the largest entry, all eigenvalues `> 0`."""

    fix = "Symmetrise it (`(A + A.T) / 2`) and add jitter: `A + 1e-6 * jnp.eye(n)`."

    def _test(self, v):
        finite = jnp.all(jnp.isfinite(v), axis=(-2, -1))
        eye = jnp.eye(v.shape[-1], dtype=v.dtype)
        safe = jnp.where(finite[..., None, None], v, eye)
        vt = jnp.swapaxes(safe, -1, -2)
        scale = jnp.max(jnp.abs(safe), axis=(-2, -1))[..., None, None]
        symmetric = jnp.all(jnp.abs(safe - vt) <= _tolerance(v) * scale, (-2, -1))
        eigenvalues = jnp.linalg.eigvalsh((safe + vt) / 2)
        return finite & symmetric & jnp.all(eigenvalues > 0, axis=-1)

    def bijector(self) -> Any:
        return _transforms.PositiveDefinite()


real = Real()
positive = Positive()
nonnegative = Nonnegative()
unit_interval = Interval(0.0, 1.0)
simplex = Simplex()
lower_cholesky = LowerCholesky()
corr_cholesky = CorrCholesky()
positive_definite = PositiveDefinite()


greater_than = GreaterThan
less_than = LessThan


def interval(low: ArrayLike, high: ArrayLike) -> Constraint:
    """The open interval `(low, high)`.

    An infinite scalar bound gives the one-sided constraint: `interval(0, inf)` is
    `greater_than(0)`, `interval(-inf, inf)` is `real`.
    """

    def infinite(x: Any, sign: int) -> bool:
        scalar = not _errors.is_traced(x) and np.ndim(x) == 0
        return scalar and bool(np.asarray(x) == sign * np.inf)

    if infinite(low, -1):
        return real if infinite(high, 1) else LessThan(high)
    return GreaterThan(low) if infinite(high, 1) else Interval(low, high)


# --- constraint -> default bijector ------------------------------------------------

_FACTORIES: dict[type, Callable[[Any], Any]] = {}


def register_bijector(constraint_type: type) -> Callable[[Callable], Callable]:
    """Register the default bijector of a constraint type (like numpyro's `biject_to`),
    for a constraint class you do not own; it takes precedence over the class's
    own `bijector` method.

    The decorated factory takes the constraint instance and returns a bijector:
    a `FixedDistrax` bijector, a raw TFP bijector, or an `eqx.Module` with
    `forward`, `inverse` and `forward_log_det_jacobian`. Lookup is by
    `type(constraint)`. Its `forward_log_det_jacobian` must be the density
    correction with respect to the constraint's own measure (for matrices: the
    free entries), so that a prior pushed back integrates to 1.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep
    from tensorflow_probability.substrates import jax as tfp

    class Negative(ep.constraints.Constraint):
        def check(self, value):
            return (value < 0) & jnp.isfinite(value)

    @ep.register_bijector(Negative)
    def _(constraint):
        return ep.FixedDistrax(tfp.bijectors.Chain, [
            ep.FixedDistrax(tfp.bijectors.Scale, jnp.array(-1.0)),
            ep.FixedDistrax(tfp.bijectors.Exp),
        ])

    bijector = ep.default_bijector(Negative())
    print(bijector.forward(jnp.array(0.0)))  # -1.0
    ```
    """
    if not (
        isinstance(constraint_type, type) and issubclass(constraint_type, Constraint)
    ):
        raise TypeError(
            f"register_bijector takes a `Constraint` subclass, got {constraint_type!r}."
        )

    def decorator(factory: Callable) -> Callable:
        _FACTORIES[constraint_type] = factory
        return factory

    return decorator


def default_bijector(constraint: Constraint) -> Any:
    """The default bijector from unconstrained space onto `constraint`'s support.

    **Raises:**

    `TypeError` naming the constraint if no bijector is registered for its type.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    softplus = ep.default_bijector(ep.constraints.positive)
    print(softplus.forward(jnp.array(0.0)))  # log(2) = 0.6931...
    ```
    """
    constraint = as_constraint(constraint, "default_bijector")
    factory = _FACTORIES.get(type(constraint), type(constraint).bijector)
    bijector = factory(constraint)
    if bijector is None:
        raise TypeError(
            f"No default bijector is registered for {constraint!r}: register one with "
            f"`@ep.register_bijector({type(constraint).__name__})` or pass `bijector=`."
        )
    return as_transform(bijector, f"default_bijector({constraint!r})")


def as_transform(transform: Any, owner: str) -> Any:
    """`transform` stored as `_transforms.as_transform` keeps it, a raw TFP or
    numpyro bijector (or a distrax one holding arrays) first rebuilt as an
    `ep.FixedDistrax`, so that its arrays are leaves. `owner` names the parameter
    or function for error messages."""
    if _families.is_raw_bijector(transform) and not _static_distrax(transform):
        try:
            transform = FixedDistrax.from_instance(transform)
        except TypeError as e:
            raise TypeError(f"{owner}: {e}") from None
    return _transforms.as_transform(transform, owner)


def _static_distrax(transform: Any) -> bool:
    """A raw distrax bijector without arrays: kept as a static value."""
    if not isinstance(transform, distrax.Bijector):
        return False
    try:
        hash(Const(transform))
    except TypeError:
        return False
    return True


# --- constraints of other libraries ---------------------------------------------


def as_constraint(constraint: Any, name: str) -> Constraint:
    """An eqxprob `Constraint`; numpyro's constraint objects map to ours (same
    default bijectors). Anything else is a `TypeError` naming `name`."""
    if isinstance(constraint, Constraint):
        return constraint
    if (converted := _from_numpyro(constraint)) is not None:
        return converted
    hint, shortcut = "", str(getattr(constraint, "__name__", ""))
    ours = "interval(low, high)" if shortcut == "bounded" else shortcut
    if shortcut == "bounded" or isinstance(globals().get(ours), Constraint):
        hint = (  # `ep.positive` & co., the shortcuts that build parameters
            f" `ep.{shortcut}` builds a parameter from a value; the constraint is "
            f"`ep.constraints.{ours}`."
        )
    raise TypeError(
        f"{name}: `constraint` must be an `ep.constraints` member (or a numpyro "
        f"constraint), got {constraint!r}.{hint}"
    )


def _from_numpyro(c: Any) -> Constraint | None:
    """numpyro's public constraint objects, by class name and public attributes."""
    if not type(c).__module__.startswith("numpyro"):
        return None
    name = _snake(type(c).__name__.lstrip("_"))
    if name == "greater_than":
        return greater_than(c.lower_bound)
    if name == "greater_than_eq" and np.all(np.asarray(c.lower_bound) == 0):
        return nonnegative
    if name == "less_than":
        return less_than(c.upper_bound)
    if name in ("interval", "open_interval"):
        return interval(c.lower_bound, c.upper_bound)
    ours = globals().get("positive" if name == "softplus_positive" else name)
    return ours if isinstance(ours, Constraint) else None  # `real`, `simplex`, ...
