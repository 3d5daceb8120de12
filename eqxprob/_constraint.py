"""Constraints: the support a parameter must lie in, and its default bijector.

A `Constraint` owns everything about its support: `check` (with one tolerance per
dtype, `tolerance`), its event dimensionality, the message that says how to fix a
value outside it, and its default bijector (`bijector`). The
shortcuts (`ep.positive`, ...) and the registry (`ep.field(constraint=...)`) both
call `validate` and `default_bijector` here, so there is one rule per constraint.

**Where to add a constraint:** one subclass of `Constraint` in this file (or your
own), with `check`, `fix` and `bijector` (the built-in transforms live in
`_transforms.py`), plus its export line in `constraints.py`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from . import _errors, _transforms


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

    def _host_check(self, value: np.ndarray) -> np.ndarray:
        """`check` on a NumPy array; built-ins override it to compile nothing."""
        return np.asarray(self.check(jnp.asarray(value)))

    def _shape_error(self, shape: tuple[int, ...]) -> str | None:
        """Why an array of `shape` cannot be in the support at all, or `None`."""
        if len(shape) < self.event_ndim:
            return f"needs at least {self.event_ndim} dimension(s)"
        return None

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
    """`constraint.check(value)`: on the host (NumPy, compiles nothing) for a
    concrete value, with JAX for a traced one."""
    v = _errors.host(value)
    return constraint.check(v) if _errors.is_traced(v) else constraint._host_check(v)


def validate(constraint: Constraint, value: Array, name: str) -> Array:
    """Return `value`, or raise `ValueError` naming `name` if it is outside
    `constraint` (an `eqx.error_if` with the same message under `jit`)."""
    problem = constraint._shape_error(tuple(np.shape(value)))
    if problem is not None:
        raise ValueError(
            f"{name}: {constraint!r} {problem}, but the value has shape "
            f"{tuple(np.shape(value))}."
        )
    ok = holds(constraint, value)
    batch = tuple(np.shape(value))[: np.ndim(value) - constraint.event_ndim]
    if not _errors.broadcasts_to(np.shape(ok), batch):
        raise TypeError(
            f"{type(constraint).__name__}.check returned shape {np.shape(ok)} for a "
            f"value of shape {np.shape(value)}; it must return one flag per "
            f"{'entry' if constraint.event_ndim == 0 else 'event'}, shape {batch} "
            f"(event_ndim = {constraint.event_ndim})."
        )
    return _errors.check(
        value,
        ~ok,
        f"{name}: the value must lie in {constraint!r}",
        constraint.fix,
        ("value", value),
    )


# --- built-in constraints ---------------------------------------------------------


class _Tested(Constraint):
    """A built-in constraint: one `_test(v, xp)` serves JAX (`check`, traced or
    not) and NumPy (`_host_check`, which compiles nothing)."""

    def check(self, value: Float[Array, "*shape"]) -> Bool[Array, "*batch"]:
        return self._test(jnp.asarray(value), jnp)

    def _host_check(self, value: np.ndarray) -> np.ndarray:
        return self._test(np.asarray(value), np)

    @abc.abstractmethod
    def _test(self, v: Any, xp: Any) -> Any: ...


class _Elementwise(_Tested):
    """A constraint checked entry by entry."""


class Real(_Elementwise):
    """Finite real numbers (NaN and ±inf are outside)."""

    fix = "Pass finite values."

    def _test(self, v, xp):
        return xp.isfinite(v)

    def bijector(self) -> Any:
        return _transforms.Identity()

    def __repr__(self) -> str:
        return "constraints.real"


class Positive(_Elementwise):
    """Finite values `> 0`."""

    fix = "Pass finite values > 0, e.g. `jnp.maximum(value, 1e-6)`."

    def _test(self, v, xp):
        return (v > 0) & (v < np.inf)

    def bijector(self) -> Any:
        return _transforms.Softplus()

    def __repr__(self) -> str:
        return "constraints.positive"


class Nonnegative(_Elementwise):
    """Finite values `>= 0` (zero included, as GPJax's `NonNegativeReal`)."""

    fix = "Pass finite values >= 0."

    def _test(self, v, xp):
        return (v >= 0) & (v < np.inf)

    def bijector(self) -> Any:
        return _transforms.Softplus(floor=True)

    def __repr__(self) -> str:
        return "constraints.nonnegative"


def _bound(x: ArrayLike, name: str, what: str) -> Any:
    """A bound as given (NumPy on the host, or traced), checked to be real."""
    if _errors.is_traced(x):
        return x
    x = np.asarray(x)
    if np.iscomplexobj(x) or not np.issubdtype(x.dtype, np.number):
        raise TypeError(f"{what}: `{name}` must be a real number, got {x!r}.")
    return x[()] if x.ndim == 0 else x


def _check_bounds(what: str, low: Any = None, high: Any = None) -> tuple[Any, Any]:
    """Finite bounds with `low < high`: returned as given, or with `eqx.error_if`s
    attached when traced (keep the returned values)."""
    checked = []
    for name, b in (("low", low), ("high", high)):
        if b is not None:
            v = _errors.host(b)
            b = _errors.check(
                b,
                ~(abs(v) < np.inf),
                f"{what}: `{name}` must be finite",
                _ONE_SIDED,
                (name, b),
            )
        checked.append(b)
    low, high = checked
    if low is not None and high is not None:
        lo, hi = _errors.host(low), _errors.host(high)
        low = _errors.check(
            low,
            ~(lo < hi),
            f"{what}: `low` must be smaller than `high`",
            "Swap or fix the bounds.",
            f"(low, high) = ({_errors.short(low)}, {_errors.short(high)})",
        )
    return low, high


_ONE_SIDED = (
    "For a one-sided support use `ep.constraints.interval(low, jnp.inf)` (which is "
    "`greater_than(low)`) or `less_than(high)`."
)


class GreaterThan(_Elementwise):
    """Finite values `> low`."""

    def __init__(self, low: ArrayLike):
        what = "constraints.greater_than"
        self.low, _ = _check_bounds(what, low=_bound(low, "low", what))

    fix = "Pass finite values above the lower bound."

    def _test(self, v, xp):
        return (v > self.low) & (v < np.inf)

    def bijector(self) -> Any:
        return _transforms.SoftplusFrom(self.low, 1.0)

    def __repr__(self) -> str:
        return f"constraints.greater_than({_errors.short(self.low)})"


class LessThan(_Elementwise):
    """Finite values `< high`."""

    def __init__(self, high: ArrayLike):
        what = "constraints.less_than"
        _, self.high = _check_bounds(what, high=_bound(high, "high", what))

    fix = "Pass finite values below the upper bound."

    def _test(self, v, xp):
        return (v < self.high) & (v > -np.inf)

    def bijector(self) -> Any:
        return _transforms.SoftplusFrom(self.high, -1.0)

    def __repr__(self) -> str:
        return f"constraints.less_than({_errors.short(self.high)})"


class Interval(_Elementwise):
    """The open interval `(low, high)`, finite bounds with `low < high`
    (broadcastable arrays allowed). Use `interval(low, high)`, which also accepts
    an infinite bound."""

    def __init__(self, low: ArrayLike, high: ArrayLike):
        what = "constraints.interval"
        self.low, self.high = _check_bounds(
            what, _bound(low, "low", what), _bound(high, "high", what)
        )

    fix = (
        "The interval is open (a sigmoid reaches a bound only at ±inf): move the "
        "value inside, or widen the bounds."
    )

    def _test(self, v, xp):
        return (v > self.low) & (v < self.high)

    def bijector(self) -> Any:
        return _transforms.Sigmoid(self.low, self.high)

    def __repr__(self) -> str:
        low, high = _errors.short(self.low), _errors.short(self.high)
        return f"constraints.interval({low}, {high})"


class Simplex(_Tested):
    """Vectors of positive entries summing to 1 along the last axis (the open
    simplex), the sum within `tolerance(dtype)`."""

    event_ndim = 1
    fix = (
        "Entries must be > 0 and sum to 1: normalise with "
        "`value / value.sum(-1, keepdims=True)`, and mix in a little of the uniform "
        "distribution for zeros: `(1 - eps) * value + eps / n`."
    )

    def _test(self, v, xp):
        tol = _errors.tolerance(_float_dtype(v))
        total = xp.sum(v, axis=-1)
        positive = xp.all((v > 0) & (v < np.inf), axis=-1)
        return positive & (xp.abs(total - 1) <= tol)

    def _shape_error(self, shape):
        if len(shape) < 1 or shape[-1] < 1:
            return "needs a last axis of size >= 1"
        return None

    def bijector(self) -> Any:
        return _transforms.SoftmaxCentered()

    def __repr__(self) -> str:
        return "constraints.simplex"


def _float_dtype(v: Any) -> Any:
    dtype = v.dtype
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


class _Square(_Tested):
    """A constraint on square matrices."""

    event_ndim = 2

    def _shape_error(self, shape):
        if len(shape) < 2 or shape[-1] != shape[-2]:
            return "needs square matrices, shape (..., n, n)"
        return None


def _triangular(v, xp):
    """Lower-triangular with a finite, positive diagonal (one flag per matrix)."""
    n = v.shape[-1]
    upper = np.triu(np.ones((n, n), bool), 1)
    finite = xp.all(xp.isfinite(v), axis=(-2, -1))
    zero_above = xp.all(xp.where(upper, v == 0, True), axis=(-2, -1))
    diagonal = xp.diagonal(v, axis1=-2, axis2=-1)
    return finite & zero_above & xp.all(diagonal > 0, axis=-1)


class LowerCholesky(_Square):
    """Lower-triangular square matrices with a finite, positive diagonal (Cholesky
    factors of covariance matrices)."""

    fix = (
        "Pass `jnp.linalg.cholesky(cov)`; negate each column whose diagonal entry is "
        "negative (`L @ L.T` is unchanged) and zero the upper triangle."
    )

    def _test(self, v, xp):
        return _triangular(v, xp)

    def bijector(self) -> Any:
        return _transforms.LowerCholesky()

    def __repr__(self) -> str:
        return "constraints.lower_cholesky"


class CorrCholesky(_Square):
    """Cholesky factors of correlation matrices: lower-triangular, positive
    diagonal, rows of unit Euclidean norm (within `tolerance(dtype)`); the support
    of an LKJ prior."""

    fix = (
        "Pass `jnp.linalg.cholesky(corr)` of a correlation matrix (unit diagonal), "
        "or normalise each row of a Cholesky factor to unit norm."
    )

    def _test(self, v, xp):
        tol = _errors.tolerance(_float_dtype(v))
        norms = xp.sum(xp.where(xp.isfinite(v), v, 0) ** 2, axis=-1)
        return _triangular(v, xp) & xp.all(xp.abs(norms - 1) <= tol, axis=-1)

    def bijector(self) -> Any:
        return _transforms.CorrCholesky()

    def __repr__(self) -> str:
        return "constraints.corr_cholesky"


class PositiveDefinite(_Square):
    """Symmetric positive-definite matrices (covariance matrices): symmetric within
    `tolerance(dtype)` relative to the largest entry, all eigenvalues `> 0`."""

    fix = (
        "Symmetrise it (`(A + A.T) / 2`) and add jitter to the diagonal "
        "(`A + 1e-6 * jnp.eye(n)`)."
    )

    def _test(self, v, xp):
        tol = _errors.tolerance(_float_dtype(v))
        finite = xp.all(xp.isfinite(v), axis=(-2, -1))
        n = v.shape[-1]
        safe = xp.where(finite[..., None, None], v, np.eye(n, dtype=v.dtype))
        vt = xp.swapaxes(safe, -1, -2)
        scale = xp.max(xp.abs(safe), axis=(-2, -1))
        symmetric = xp.all(xp.abs(safe - vt) <= tol * scale[..., None, None], (-2, -1))
        eigenvalues = xp.linalg.eigvalsh((safe + vt) / 2)
        return finite & symmetric & xp.all(eigenvalues > 0, axis=-1)

    def bijector(self) -> Any:
        return _transforms.PositiveDefinite()

    def __repr__(self) -> str:
        return "constraints.positive_definite"


real = Real()
positive = Positive()
nonnegative = Nonnegative()
unit_interval = Interval(0.0, 1.0)
simplex = Simplex()
lower_cholesky = LowerCholesky()
corr_cholesky = CorrCholesky()
positive_definite = PositiveDefinite()


def greater_than(low: ArrayLike) -> GreaterThan:
    """Finite values `> low`."""
    return GreaterThan(low)


def less_than(high: ArrayLike) -> LessThan:
    """Finite values `< high`."""
    return LessThan(high)


def interval(low: ArrayLike, high: ArrayLike) -> Constraint:
    """The open interval `(low, high)`.

    An infinite scalar bound gives the one-sided constraint: `interval(0, inf)` is
    `greater_than(0)`, `interval(-inf, inf)` is `real`.
    """
    lo = None if _errors.is_traced(low) else np.asarray(low)
    hi = None if _errors.is_traced(high) else np.asarray(high)
    if lo is not None and lo.ndim == 0 and lo == -np.inf:
        if hi is not None and hi.ndim == 0 and hi == np.inf:
            return real
        return LessThan(high)
    if hi is not None and hi.ndim == 0 and hi == np.inf:
        return GreaterThan(low)
    return Interval(low, high)


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
            "register_bijector takes a subclass of `ep.constraints.Constraint`, got "
            f"{constraint_type!r}."
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
            f"No default bijector is registered for the constraint {constraint!r} "
            f"(type {type(constraint).__name__}). Register one with "
            f"`@ep.register_bijector({type(constraint).__name__})`, or pass "
            "`bijector=` explicitly."
        )
    return _transforms.as_transform(bijector, f"default_bijector({constraint!r})")


# --- constraints of other libraries ---------------------------------------------


def as_constraint(constraint: Any, name: str) -> Constraint:
    """An eqxprob `Constraint`; numpyro's constraint objects map to ours (same
    default bijectors). Anything else is a `TypeError` naming `name`."""
    if isinstance(constraint, Constraint):
        return constraint
    converted = _from_numpyro(constraint)
    if converted is not None:
        return converted
    raise TypeError(
        f"{name}: `constraint` must be an `ep.constraints` member (or a numpyro "
        f"constraint), got {constraint!r}."
    )


def _from_numpyro(c: Any) -> Constraint | None:
    """numpyro's public constraint objects, by class name and public attributes."""
    if not type(c).__module__.startswith("numpyro"):
        return None
    name = type(c).__name__.lstrip("_")
    simple = {
        "Real": real,
        "Positive": positive,
        "SoftplusPositive": positive,
        "Nonnegative": nonnegative,
        "UnitInterval": unit_interval,
        "Simplex": simplex,
        "LowerCholesky": lower_cholesky,
        "PositiveDefinite": positive_definite,
        "CorrCholesky": corr_cholesky,
    }
    if name in simple:
        return simple[name]
    if name == "GreaterThan":
        return greater_than(c.lower_bound)
    if name == "GreaterThanEq" and np.all(np.asarray(c.lower_bound) == 0):
        return nonnegative
    if name == "LessThan":
        return less_than(c.upper_bound)
    if name in ("Interval", "OpenInterval"):
        return interval(c.lower_bound, c.upper_bound)
    return None
