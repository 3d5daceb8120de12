"""The support of a prior, so that `ep.log_prior` is `-inf` outside it.

distrax and TFP continue a density's formula outside its support (TFP's
`Exponential(1e-5).log_prob(-1.)` is a finite -11.5, distrax's `Gamma` gives NaN);
numpyro distributions carry a `support` constraint. `in_support` answers for all
three: numpyro's own `support`, else a table of supports by class (the class
itself, not a subclass, which may define another support) for the distrax/TFP
classes most used as priors.

**Where to add a prior's support:** one line in `_RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import distrax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array
from tensorflow_probability.substrates import jax as tfp

from . import _constraint, _errors
from ._families import NUMPYRO, as_tuple, family_of_instance, raw


tfd = tfp.distributions


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


_NONNEGATIVE = [
    tfd.Chi, tfd.Chi2, tfd.Exponential, tfd.Gamma, distrax.Gamma, tfd.HalfCauchy,
    tfd.HalfNormal, tfd.HalfStudentT, tfd.InverseGamma, tfd.InverseGaussian,
    tfd.LogLogistic, tfd.LogNormal, tfd.Weibull,
]  # fmt: skip
_RULES: dict[type, Callable[[Any, Array], Array]] = {
    **dict.fromkeys(_NONNEGATIVE, lambda d, v: v >= 0),
    **dict.fromkeys(
        [tfd.Beta, distrax.Beta, tfd.Kumaraswamy], lambda d, v: (v >= 0) & (v <= 1)
    ),
    **dict.fromkeys(
        [tfd.Uniform, distrax.Uniform, tfd.TruncatedNormal],
        lambda d, v: (v >= d.low) & (v <= d.high),
    ),
    **dict.fromkeys([tfd.Poisson, tfd.Geometric, tfd.NegativeBinomial], _integer),
    tfd.CholeskyLKJ: lambda d, v: _constraint.corr_cholesky.check(v),
    tfd.Pareto: lambda d, v: v >= d.scale,
    tfd.Dirichlet: _simplex,
    distrax.Dirichlet: _simplex,
    tfd.WishartTriL: _wishart,
    tfd.LKJ: _lkj,
    tfd.Binomial: lambda d, v: _integer(d, v) & (v <= d.total_count),
    **dict.fromkeys(
        [tfd.Bernoulli, distrax.Bernoulli], lambda d, v: (v == 0) | (v == 1)
    ),
}
_INDEPENDENT = (tfd.Independent, distrax.Independent)
_TRANSFORMED = (tfd.TransformedDistribution, distrax.Transformed)


def _all_last(ok: Array, k: int) -> Array:
    return jnp.all(ok, axis=tuple(range(ok.ndim - k, ok.ndim))) if k else ok


def in_support(prior: Any, value: Array) -> Array | None:
    """Boolean array of the prior's batch shape (is each value in the support?),
    or `None` when the support is unknown (then the library's own answer
    stands). Wrappers (`Independent`, `Sample`, transformed distributions) are
    answered through their base distribution."""
    d = raw(prior)
    if family_of_instance(d) is NUMPYRO:
        return jnp.asarray(d.support(value))
    cls, value = type(d), jnp.asarray(value)
    if cls in (*_INDEPENDENT, tfd.Sample):
        base = in_support(d.distribution, value)
        if cls in _INDEPENDENT:
            k = d.reinterpreted_batch_ndims
        else:
            k = len(np.atleast_1d(np.asarray(d.sample_shape)))
        return None if base is None else _all_last(base, k)
    if cls in _TRANSFORMED:
        x = d.bijector.inverse(value)
        base = in_support(d.distribution, x)
        finite = _all_last(jnp.isfinite(x), len(as_tuple(d.distribution.event_shape)))
        return finite if base is None else finite & base
    rule = _RULES.get(cls)
    return None if rule is None else rule(d, value)
