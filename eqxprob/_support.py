"""The support of a prior, so that `ep.log_prior` is `-inf` outside it.

distrax and TFP continue a density's formula outside its support (TFP's
`Exponential(1e-5).log_prob(-1.)` is a finite -11.5, distrax's `Gamma` gives NaN);
numpyro distributions carry a `support` constraint. `in_support` answers for all
three: numpyro's own `support`, else a table of supports by class name for the
distrax/TFP classes most used as priors.

**Where to add a prior's support:** one line in `_RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from . import _constraint, _errors
from ._families import as_tuple


def _simplex(d: Any, v: Array) -> Array:
    tol = _errors.tolerance(v.dtype)
    return jnp.all(v >= 0, axis=-1) & (jnp.abs(jnp.sum(v, axis=-1) - 1) <= tol)


def _integer(d: Any, v: Array) -> Array:
    return (v >= 0) & (v == jnp.floor(v))


def _wishart(d: Any, v: Array) -> Array:
    if getattr(d, "input_output_cholesky", False):
        return _constraint.lower_cholesky.check(v)
    return _constraint.positive_definite.check(v)


def _lkj(d: Any, v: Array) -> Array:
    if getattr(d, "input_output_cholesky", False):
        return _constraint.corr_cholesky.check(v)
    tol = _errors.tolerance(v.dtype)
    unit = jnp.all(jnp.abs(jnp.diagonal(v, axis1=-2, axis2=-1) - 1) <= tol, axis=-1)
    return _constraint.positive_definite.check(v) & unit


_NONNEGATIVE = """Chi Chi2 Exponential Gamma HalfCauchy HalfNormal HalfStudentT
    InverseGamma InverseGaussian LogLogistic LogNormal Weibull""".split()
_RULES: dict[str, Callable[[Any, Array], Array]] = {
    **dict.fromkeys(_NONNEGATIVE, lambda d, v: v >= 0),
    **dict.fromkeys(["Beta", "Kumaraswamy"], lambda d, v: (v >= 0) & (v <= 1)),
    **dict.fromkeys(
        ["Uniform", "TruncatedNormal"], lambda d, v: (v >= d.low) & (v <= d.high)
    ),
    **dict.fromkeys(["Poisson", "Geometric", "NegativeBinomial"], _integer),
    **dict.fromkeys(
        ["CholeskyLKJ", "LKJCholesky"], lambda d, v: _constraint.corr_cholesky.check(v)
    ),
    "Pareto": lambda d, v: v >= d.scale,
    "Dirichlet": _simplex,
    "WishartTriL": _wishart,
    "LKJ": _lkj,
    "Binomial": lambda d, v: _integer(d, v) & (v <= d.total_count),
    "Bernoulli": lambda d, v: (v == 0) | (v == 1),
}


def _raw(prior: Any) -> Any:
    return prior.instantiate() if hasattr(type(prior), "instantiate") else prior


def _all_last(ok: Array, k: int) -> Array:
    return jnp.all(ok, axis=tuple(range(ok.ndim - k, ok.ndim))) if k else ok


def in_support(prior: Any, value: Array) -> Array | None:
    """Boolean array of the prior's batch shape (is each value in the support?),
    or `None` when the support is unknown (then the library's own answer
    stands). Wrappers (`Independent`, `Sample`, transformed distributions) are
    answered through their base distribution."""
    raw = _raw(prior)
    support = getattr(raw, "support", None)
    if support is not None and type(support).__module__.startswith("numpyro"):
        return jnp.asarray(support(value))
    name = type(raw).__name__
    value = jnp.asarray(value)
    if name in ("Independent", "Sample"):  # distrax and TFP; TFP
        base = in_support(raw.distribution, value)
        if name == "Independent":
            k = raw.reinterpreted_batch_ndims
        else:
            k = len(np.atleast_1d(np.asarray(raw.sample_shape)))
        return None if base is None else _all_last(base, k)
    if name in ("Transformed", "TransformedDistribution"):  # distrax, TFP
        x = raw.bijector.inverse(value)
        base = in_support(raw.distribution, x)
        finite = _all_last(jnp.isfinite(x), len(as_tuple(raw.distribution.event_shape)))
        return finite if base is None else finite & base
    rule = _RULES.get(name)
    return None if rule is None else rule(raw, value)
