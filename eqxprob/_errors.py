"""Shared helpers for error messages and for checks that hold eagerly and under `jit`.

A check is written once, as a boolean "bad" array computed from host (NumPy) values
when they are concrete, or from traced values under a JAX transformation. `check`
then raises a `ValueError` that names the offending entries, or adds an
`eqx.error_if` with the same message (without the values, which are unknown at
trace time).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike


def is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def host(x: Any) -> Any:
    """A NumPy copy of a concrete value (checks on it compile nothing); tracers as
    they are."""
    return x if is_traced(x) else np.asarray(x)


def short(x: Any) -> str:
    """A value for a message, in its own dtype's shortest form (`0.1`, not
    `0.10000000149011612`)."""
    if is_traced(x):
        return "(traced)"
    x = np.asarray(x)
    if x.ndim == 0:
        return str(x[()])
    return np.array2string(x, threshold=6, separator=", ").replace("\n", "")


def display(x: Any) -> str:
    """A value for a table or a repr: six significant digits, big arrays as their
    mean and range."""
    if is_traced(x):
        return "(traced)"
    a = np.asarray(x)
    if a.size == 0:
        return "[]"
    if a.ndim == 0:
        return f"{a[()]:.6g}" if np.issubdtype(a.dtype, np.floating) else str(a[()])
    if a.size <= 4:
        return "[" + ", ".join(display(v) for v in a.ravel()) + "]"
    if np.issubdtype(a.dtype, np.number):
        return f"mean {a.mean():.4g}, range [{a.min():.4g}, {a.max():.4g}]"
    return f"{a.dtype}[{a.size}]"


def entries(name: str, x: Any, bad: np.ndarray, limit: int = 3) -> str:
    """`value[1] = -0.5, value[3] = 0.0`: the entries of `x` where `bad`.

    `bad` may have fewer dimensions than `x` (one flag per matrix, say): then the
    flagged sub-arrays are shown.
    """
    x = np.asarray(x)
    if bad.ndim == 0:
        return f"{name} = {short(x)}"
    index = np.argwhere(bad)
    shape = np.broadcast_shapes(bad.shape, x.shape[: bad.ndim])
    x = np.broadcast_to(x, shape + x.shape[bad.ndim :])
    shown = [f"{name}{list(map(int, i))} = {short(x[tuple(i)])}" for i in index[:limit]]
    more = f" (and {len(index) - limit} more)" if len(index) > limit else ""
    return ", ".join(shown) + more


def check(x: Array, bad: Any, what: str, fix: str, shown: Any = None) -> Array:
    """Return `x`, or raise where `bad`.

    With concrete values a `ValueError` says `what`, names the offending entries of
    `shown` (a `(name, array)` pair, default `("value", x)`, or a ready string) and
    says how to `fix` it. Under a JAX transformation `eqx.error_if` checks at run
    time instead, with the same message: keep the returned `x`, or the check is
    dropped.
    """
    if is_traced(bad):
        return eqx.error_if(x, jnp.any(bad), f"{what}. {fix}")
    bad = np.asarray(bad)
    if bad.any():
        if not isinstance(shown, str):
            name, array = shown or ("value", x)
            shown = entries(name, array, bad)
        raise ValueError(f"{what}, but {shown}. {fix}")
    return x


def check_finite(x: Array, what: str, fix: str, shown: Any = None) -> Array:
    """`check` that `x` is finite (NaN and ±inf flagged)."""
    return check(x, ~(abs(host(x)) < np.inf), what, fix, shown)


def as_float(x: ArrayLike, name: str) -> Array:
    """A real floating-point array with a concrete (non-weak) dtype.

    Integers and bools become the default float dtype; complex values are a
    `TypeError` naming `name`. A concrete dtype means a jitted step fed the result
    never compiles twice. Python and NumPy input is converted on the host (eager
    JAX operations compile once per shape).
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = (x := np.asarray(x)).dtype
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"{name}: complex values are not supported (got dtype {dtype}); pass "
            "the real part, or parameterise real and imaginary parts separately."
        )
    if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        raise TypeError(f"{name}: expected a real array, got dtype {dtype}.")
    if isinstance(x, jax.Array):  # `astype` to its own dtype drops weak typing
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return x.astype(x.dtype if floating else jnp.result_type(float))
    x = np.asarray(x)
    x = x if np.issubdtype(x.dtype, np.floating) else x.astype(float)
    return jnp.asarray(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype))


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an array of `shape` broadcasts to `target` without growing it."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def tolerance(dtype: Any) -> float:
    """The one tolerance of every constraint check in `dtype`: √eps (3.5e-4 in
    float32, 1.5e-8 in float64), for sums, symmetry and unit norms."""
    return float(np.sqrt(np.finfo(dtype).eps))
