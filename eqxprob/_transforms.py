"""Transforms: the built-in pure-JAX bijectors and the one adapter for all others.

Every place that applies a bijector (`ep.Bijector`, `ep.resolve`, the shortcuts,
`ep.unconstrain`/`constrain`/`parameterize`/`log_prior`, `ep.log_det_jacobian`)
goes through `as_transform` (storage), `forward`, `inverse` and `log_det` here. They
accept a wrapped bijector (`ep.FixedDistrax`, known here as `_families.Wrapped`, so
that this protocol sits below the wrapper), a raw distrax bijector without arrays, a
built-in bijector, a plain callable (forward only) and any PyTree with `forward`. The
parameter layer (`_constraint.as_transform`) rebuilds any other raw library bijector
as a wrapper before it is stored here.

The built-in bijectors are small `eqx.Module`s (subclasses of `BuiltIn`) rather
than `FixedDistrax(tfb.X)`; they agree with TFP to rounding (see the tests). Each
`forward_log_det_jacobian` is the density correction with respect to the
constraint's own measure: for a simplex, the first `n - 1` coordinates; for a
Cholesky factor, the lower-triangle entries; for a covariance matrix, its lower
triangle; for a correlation Cholesky factor, the strictly lower triangle. A prior
pushed back to unconstrained space through them integrates to one.

**Where to add a transform:** a new `BuiltIn` subclass with `forward`, `inverse`,
`forward_log_det_jacobian`, `event_ndim` and `name` below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl
from jaxtyping import Array
from tensorflow_probability.substrates import jax as tfp

from . import _errors, _families
from ._families import Wrapped
from ._static import Const


tfb = tfp.bijectors


# ------------------------------------------------------------ built-in bijectors


def _newton(forward: Callable, slope: Callable, x: Array, y: Array) -> Array:
    """One Newton step on `forward(x) = y`, with the inverse's own gradient.

    In float32 a closed-form inverse is off by about one ulp of `x`, which is up to
    1e-6 relative in `forward(x)`; the step brings it to half an ulp.
    """
    step = (forward(x) - y) / slope(x)
    return x - jax.lax.stop_gradient(jnp.where(jnp.isfinite(step), step, 0))


def inverse_softplus(y: Array) -> Array:
    """`log(expm1(y))`, written to be exact from 1e-30 to 1e30."""
    x = y + jnp.log(-jnp.expm1(-y))
    return _newton(jax.nn.softplus, jax.nn.sigmoid, x, y)


def _like(bound: Array, x: Array) -> Array:
    """`bound` in `x`'s floating dtype, so a float32 parameter stays float32 when
    its bounds were given in float64 (a no-op when the dtypes agree)."""
    dtype = jnp.result_type(x)
    return bound.astype(dtype) if jnp.issubdtype(dtype, jnp.floating) else bound


class BuiltIn(eqx.Module):
    """A built-in bijector: `event_ndim`, `name` for messages, and the magnitude
    `round_trip_scale(y)` that the round-trip tolerance is relative to, besides
    the value itself."""

    event_ndim: ClassVar[int] = 0

    def round_trip_scale(self, y: Array) -> Any:
        return 0.0


class Identity(BuiltIn):
    """`x ↦ x`."""

    name = "identity"

    def forward(self, x: Array) -> Array:
        return x

    def inverse(self, y: Array) -> Array:
        return y

    def forward_log_det_jacobian(self, x: Array) -> Array:
        return jnp.zeros_like(x)


class Softplus(BuiltIn):
    """`x ↦ log(1 + eˣ)`, onto `(0, ∞)`; with `floor=True` the inverse maps 0 to
    the smallest normal number's preimage, so `nonnegative` values round-trip."""

    floor: bool = eqx.field(static=True, default=False)
    name = "softplus"

    def round_trip_scale(self, y):
        # With the floor, values near 0 may resolve to a few times the smallest
        # normal number: an absolute error, fine for a support that includes 0.
        info = np.finfo(y.dtype)
        return float(8 * info.tiny / info.eps) if self.floor else 0.0

    def forward(self, x: Array) -> Array:
        return jax.nn.softplus(x)

    def inverse(self, y: Array) -> Array:
        if self.floor:
            y = jnp.maximum(y, jnp.finfo(jnp.result_type(y)).tiny)
        return inverse_softplus(y)

    def forward_log_det_jacobian(self, x: Array) -> Array:
        return jax.nn.log_sigmoid(x)


class SoftplusFrom(BuiltIn):
    """`x ↦ origin + sign·softplus(x)`: onto `(origin, ∞)` for `sign = 1`, onto
    `(-∞, origin)` for `sign = -1`."""

    origin: Array
    sign: float = eqx.field(static=True)

    def __init__(self, origin: Any, sign: float):
        self.origin = _errors.as_float(origin, "origin")
        self.sign = float(sign)

    @property
    def name(self) -> str:
        return f"{_errors.short(self.origin)} {'+' if self.sign > 0 else '-'} softplus"

    def round_trip_scale(self, y):
        return jnp.abs(self.origin.astype(y.dtype))

    def forward(self, x: Array) -> Array:
        return _like(self.origin, x) + self.sign * jax.nn.softplus(x)

    def inverse(self, y: Array) -> Array:
        return inverse_softplus(self.sign * (y - _like(self.origin, y)))

    def forward_log_det_jacobian(self, x: Array) -> Array:
        return jax.nn.log_sigmoid(x)


class Sigmoid(BuiltIn):
    """`x ↦ high·σ(x) + low·σ(-x)`, onto `(low, high)`; exact near either bound and
    free of overflow for bounds up to the dtype's maximum."""

    low: Array
    high: Array

    def __init__(self, low: Any, high: Any):
        self.low = _errors.as_float(low, "low")
        self.high = _errors.as_float(high, "high")

    @property
    def name(self) -> str:
        return f"sigmoid({_errors.short(self.low)}, {_errors.short(self.high)})"

    def round_trip_scale(self, y):
        return jnp.maximum(jnp.abs(self.low), jnp.abs(self.high)).astype(y.dtype)

    def forward(self, x: Array) -> Array:
        low, high = _like(self.low, x), _like(self.high, x)
        return high * jax.nn.sigmoid(x) + low * jax.nn.sigmoid(-x)

    def inverse(self, y: Array) -> Array:
        low, high = _like(self.low, y), _like(self.high, y)
        # Halves: `y - low` overflows for bounds near the dtype's maximum.
        x = jnp.log(y / 2 - low / 2) - jnp.log(high / 2 - y / 2)
        return _newton(self.forward, self._slope, x, y)

    def _slope(self, x: Array) -> Array:
        low, high = _like(self.low, x), _like(self.high, x)
        return 2 * (high / 2 - low / 2) * jax.nn.sigmoid(x) * jax.nn.sigmoid(-x)

    def forward_log_det_jacobian(self, x: Array) -> Array:
        low, high = _like(self.low, x), _like(self.high, x)
        log_width = jnp.log(high / 2 - low / 2) + np.log(2.0).astype(x.dtype)
        return log_width + jax.nn.log_sigmoid(x) + jax.nn.log_sigmoid(-x)


def _tril_layout(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-major lower-triangle indices of an `n × n` matrix, and the diagonal's
    positions among them."""
    rows, cols = np.tril_indices(n)
    return rows, cols, np.flatnonzero(rows == cols)


def _side(m: int, offset: int = 0) -> int:
    """`n` such that `m = n(n+1)/2` (`offset=0`) or `n(n-1)/2` (`offset=1`)."""
    k = round((np.sqrt(8 * m + 1) - 1) / 2)
    if k * (k + 1) // 2 != m or k + offset < 1:
        need = "n(n+1)/2" if offset == 0 else "n(n-1)/2"
        raise ValueError(
            f"the parameter's last axis has {m} entries, which is not {need} for any n."
        )
    return k + offset


class LowerCholesky(BuiltIn):
    """A vector of `n(n+1)/2` reals ↦ lower-triangular `n × n`, positive diagonal.

    The vector holds the lower triangle row by row (`L[0,0], L[1,0], L[1,1],
    L[2,0], ...`), with softplus applied to the diagonal entries.
    """

    event_ndim = 1
    name = "lower_cholesky"

    def forward(self, x: Array) -> Array:
        x = jnp.asarray(x)
        rows, cols, _ = _tril_layout(_side(x.shape[-1]))
        # (A `where` over all entries, not a gather and a scatter of the diagonal:
        # the SVGP example's step compiles to as many instructions as by hand.)
        return _lower(jnp.where(rows == cols, jax.nn.softplus(x), x))

    def inverse(self, y: Array) -> Array:
        rows, cols, diag = _tril_layout(y.shape[-1])
        x = jnp.asarray(y)[..., rows, cols]
        return x.at[..., diag].set(inverse_softplus(x[..., diag]))

    def forward_log_det_jacobian(self, x: Array) -> Array:
        diag = _tril_layout(_side(x.shape[-1]))[2]
        return jnp.sum(jax.nn.log_sigmoid(x[..., diag]), axis=-1)


class PositiveDefinite(BuiltIn):
    """A vector of `n(n+1)/2` reals ↦ `L Lᵀ`, with `L` from `LowerCholesky`.

    The log-det is with respect to the lower triangle of the covariance matrix
    (the density convention of `tfd.WishartTriL` and numpyro's `Wishart`):
    `n log 2 + Σᵢ (n - i) log Lᵢᵢ` on top of `LowerCholesky`'s.
    """

    event_ndim = 1
    name = "positive_definite (L Lᵀ)"

    def round_trip_scale(self, y):
        return jnp.max(jnp.abs(y), axis=(-2, -1), keepdims=True)

    def forward(self, x: Array) -> Array:
        chol = LowerCholesky().forward(x)
        return chol @ jnp.swapaxes(chol, -1, -2)

    def inverse(self, y: Array) -> Array:
        return LowerCholesky().inverse(jnp.linalg.cholesky(y))

    def forward_log_det_jacobian(self, x: Array) -> Array:
        n = _side(x.shape[-1])
        diag = jax.nn.softplus(x[..., _tril_layout(n)[2]])
        powers = (n - np.arange(n)).astype(diag.dtype)
        inner = LowerCholesky().forward_log_det_jacobian(x)
        log2n = np.asarray(n * np.log(2.0), x.dtype)
        return inner + log2n + jnp.sum(powers * jnp.log(diag), axis=-1)


class CorrCholesky(BuiltIn):
    """A vector of `n(n-1)/2` reals ↦ the Cholesky factor of a correlation matrix.

    Row `i` of the factor is `[zᵢ, 1] / ‖[zᵢ, 1]‖`, where `zᵢ` holds the next `i`
    entries of the vector (TFP's `CorrelationCholesky`). The log-det is with
    respect to the strictly lower triangle (the density convention of LKJ priors
    on Cholesky factors): `-Σᵢ (i + 2)/2 · log(1 + ‖zᵢ‖²)`.
    """

    event_ndim = 1
    name = "corr_cholesky"

    def round_trip_scale(self, y):
        return 1.0

    def forward(self, x: Array) -> Array:
        z = _lower(x, offset=1)
        z = z + jnp.eye(z.shape[-1], dtype=z.dtype)
        return z / jnp.linalg.norm(z, axis=-1, keepdims=True)

    def inverse(self, y: Array) -> Array:
        rows, cols = np.tril_indices(y.shape[-1], -1)
        diagonal = jnp.diagonal(y, axis1=-2, axis2=-1)
        return (y / diagonal[..., :, None])[..., rows, cols]

    def forward_log_det_jacobian(self, x: Array) -> Array:
        z = _lower(x, offset=1)
        i = np.arange(z.shape[-1]).astype(z.dtype)
        return -jnp.sum((i + 2) / 2 * jnp.log1p(jnp.sum(z**2, axis=-1)), axis=-1)


def _lower(x: Array, offset: int = 0) -> Array:
    """The `n × n` matrix whose lower triangle (strictly lower for `offset=1`)
    holds `x`'s last axis, row by row; zeros elsewhere."""
    x = jnp.asarray(x)
    n = _side(x.shape[-1], offset)
    rows, cols = np.tril_indices(n, -offset)
    return jnp.zeros((*x.shape[:-1], n, n), x.dtype).at[..., rows, cols].set(x)


class SoftmaxCentered(BuiltIn):
    """`x ∈ ℝⁿ⁻¹ ↦ softmax([x, 0])` on the open simplex.

    The forward map is `tfb.SoftmaxCentered`'s, but the log-det is with respect to
    the first `n - 1` coordinates (the measure of `Dirichlet` densities): it
    leaves out TFP's constant `½ log n`.
    """

    event_ndim = 1
    name = "softmax_centered"

    def forward(self, x: Array) -> Array:
        return jax.nn.softmax(_append_zero(x), axis=-1)

    def inverse(self, y: Array) -> Array:
        return jnp.log(y[..., :-1]) - jnp.log(y[..., -1:])

    def forward_log_det_jacobian(self, x: Array) -> Array:
        return jnp.sum(jax.nn.log_softmax(_append_zero(x), axis=-1), axis=-1)


def _append_zero(x: Array) -> Array:
    return jnp.concatenate([x, jnp.zeros((*x.shape[:-1], 1), x.dtype)], axis=-1)


# ------------------------------------------------------------------- the adapter


class Static(eqx.Module):
    """A transform without arrays (a function, a raw distrax bijector), as static
    (compared by value, as `float_key` says)."""

    held: Const = eqx.field(static=True)

    def __getattr__(self, name: str) -> Any:
        # The held transform's own methods (`forward`, `inverse`, ...), as
        # `_method` finds them, so a bijector tree's entries answer as the
        # transforms they hold.
        if name.startswith("_") or name == "held":
            raise AttributeError(name)
        method = _method(self, name)
        if method is None:
            raise AttributeError(f"The bijector {self!r} has no `{name}`.")
        return method

    def __pdoc__(self, **kwargs: Any) -> wl.AbstractDoc:
        return wl.TextDoc(describe(self.held.value))


def as_transform(transform: Any, owner: str) -> Any:
    """Store `transform` as a proper pytree, or as a static and hashable value (a
    raw distrax bijector without arrays, a function).

    `owner` names the parameter or function for error messages. A raw library
    object with arrays is refused: the parameter layer wraps it first.
    """
    if isinstance(transform, (Static, BuiltIn)):
        return transform
    if isinstance(transform, Wrapped):
        if _families.family_of(transform.cls).is_distribution_class(transform.cls):  # pyright: ignore[reportOptionalMemberAccess]
            raise TypeError(
                f"{owner}: the bijector {transform!r} wraps a distribution; pass a "
                "bijector, e.g. `ep.FixedDistrax(tfb.Softplus)`."
            )
        return transform
    if _families.is_raw_bijector(transform):
        try:
            hash(held := Const(transform))
        except TypeError:
            raise TypeError(
                f"{owner}: the raw bijector {transform!r} holds arrays; pass it as "
                "`ep.FixedDistrax(cls, ...)`."
            ) from None
        return Static(held)
    if (
        _families.is_raw(transform)
        or isinstance(transform, (jax.Array, np.ndarray))
        or not (callable(transform) or hasattr(transform, "forward"))
    ):
        raise TypeError(
            f"{owner}: a bijector must be an `ep.FixedDistrax` bijector, a distrax "
            f"or TFP bijector, or a callable, got {transform!r}."
        )
    if isinstance(transform, eqx.Module) or jtu.tree_leaves(transform) != [transform]:
        return transform  # a pytree: its leaves stay leaves
    try:
        hash(transform)
    except TypeError:
        raise TypeError(
            f"{owner}: the callable bijector of type {type(transform).__name__} is "
            "not hashable, so it cannot be static. Use a function or an `eqx.Module`."
        ) from None
    return Static(Const(transform))


def _held(transform: Any) -> Any:
    return transform.held.value if isinstance(transform, Static) else transform


def _method(
    transform: Any, name: str, owner: str | None = None, action: str = ""
) -> Any:
    """`transform`'s method `name` (a plain callable is its own `forward`); `None`
    if it has none, or a `TypeError` naming `owner` if `owner` is given."""
    held = _held(transform)
    method = getattr(held, name, None)
    if method is None and name == "forward" and callable(held):
        return held
    if method is None and owner is not None:
        plain = " (a plain callable is forward only)" if callable(held) else ""
        raise TypeError(
            f"{owner}: the bijector {describe(transform)} has no `{name}`{plain}, so "
            f"it cannot {action}. Use one with it, e.g. `ep.FixedDistrax(tfb.Sigmoid)`."
        )
    return method


def forward(transform: Any, x: Array) -> Array:
    """`y = f(x)`."""
    # `as_transform` admits only transforms with a `forward` or callables.
    return _method(transform, "forward")(x)


def has_inverse(transform: Any) -> bool:
    return _method(transform, "inverse") is not None


def inverse(transform: Any, y: Array, owner: str) -> Array:
    """`x = f⁻¹(y)`; a `TypeError` naming `owner` if `transform` has no inverse."""
    action = "map a value to unconstrained space"
    return _method(transform, "inverse", owner, action)(y)


def event_ndim(transform: Any) -> int | None:
    """How many trailing axes of `x` one log-det term consumes, if known."""
    held = _held(transform)
    if isinstance(held, BuiltIn):
        return held.event_ndim
    if isinstance(held, (Wrapped, distrax.Bijector)):
        return held.event_ndims_in  # pyright: ignore[reportAttributeAccessIssue]
    return None


def log_det(transform: Any, x: Array, owner: str) -> Array:
    """`log|det J f(x)|` per batch element, w.r.t. the support's own measure."""
    name, action = "forward_log_det_jacobian", "give a log-det-Jacobian"
    value = _method(transform, name, owner, action)(x)
    ndim = event_ndim(transform)
    if ndim is not None:
        # TFP returns a constant Jacobian's log-det unbroadcast (`tfb.Scale(3.)`
        # gives log 3 for any x): broadcast it over the batch.
        batch = x.shape[: x.ndim - ndim]
        value = jnp.broadcast_to(value, jnp.broadcast_shapes(batch, value.shape))
    held = _held(transform)
    if isinstance(held, Wrapped) and _holds_softmax_centered(held):
        if held.cls is not tfb.SoftmaxCentered:
            raise TypeError(
                f"{owner}: the bijector {describe(transform)} contains "
                "`tfb.SoftmaxCentered` (whose TFP log-det is off by ½ log n): use it "
                "alone, or `ep.default_bijector(ep.constraints.simplex)`."
            )
        # TFP's log-det is w.r.t. the simplex embedded in ℝⁿ; Dirichlet densities
        # are w.r.t. the first n - 1 coordinates: drop TFP's ½ log n.
        value = value - np.asarray(0.5 * np.log(x.shape[-1] + 1), value.dtype)
    return value


def _holds_softmax_centered(wrapper: Wrapped) -> bool:
    is_wrapper = lambda x: isinstance(x, Wrapped)  # noqa: E731
    inner = jtu.tree_leaves(wrapper.arguments, is_leaf=is_wrapper)
    return wrapper.cls is tfb.SoftmaxCentered or any(
        is_wrapper(b) and _holds_softmax_centered(b) for b in inner
    )


def round_trip_error(transform: Any, value: Any, back: Any) -> Any:
    """Where `forward(inverse(value))` misses `value` by more than the dtype's
    tolerance (relative to the value, or to the bounds' magnitude), for the
    built-in bijectors; `None` for others."""
    held = _held(transform)
    if not isinstance(held, BuiltIn):
        return None
    scale = jnp.maximum(jnp.abs(value), held.round_trip_scale(value))
    return jnp.abs(back - value) > _errors.tolerance(value.dtype) * scale


def describe(transform: Any) -> str:
    """A public name for messages and printing: `softplus`, `tfb.Exp`, ..."""
    held = _held(transform)
    if isinstance(held, BuiltIn):
        return held.name  # pyright: ignore[reportAttributeAccessIssue]
    if isinstance(held, Wrapped):
        return _families.family_of(held.cls).qualname(held.cls)  # pyright: ignore[reportOptionalMemberAccess]
    if isinstance(held, distrax.Bijector):
        return f"distrax.{type(held).__name__}()"
    return getattr(held, "__qualname__", None) or repr(held)
