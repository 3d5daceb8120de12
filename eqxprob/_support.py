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
from jaxtyping import Array

from . import _constraint, _errors


def _nonnegative(d: Any, v: Array) -> Array:
    return v >= 0


def _unit(d: Any, v: Array) -> Array:
    return (v >= 0) & (v <= 1)


def _between(d: Any, v: Array) -> Array:
    return (v >= d.low) & (v <= d.high)


def _simplex(d: Any, v: Array) -> Array:
    tol = _errors.tolerance(v.dtype)
    return jnp.all(v >= 0, axis=-1) & (jnp.abs(jnp.sum(v, axis=-1) - 1) <= tol)


_RULES: dict[str, Callable[[Any, Array], Array]] = {
    **dict.fromkeys(
        [
            "Chi",
            "Chi2",
            "Exponential",
            "Gamma",
            "HalfCauchy",
            "HalfNormal",
            "HalfStudentT",
            "InverseGamma",
            "InverseGaussian",
            "LogLogistic",
            "LogNormal",
            "Weibull",
        ],
        _nonnegative,
    ),
    "Beta": _unit,
    "Kumaraswamy": _unit,
    "Uniform": _between,
    "TruncatedNormal": _between,
    "Pareto": lambda d, v: v >= d.scale,
    "Dirichlet": _simplex,
    "CholeskyLKJ": lambda d, v: _constraint.corr_cholesky.check(v),
    "LKJCholesky": lambda d, v: _constraint.corr_cholesky.check(v),
}


def _raw(prior: Any) -> Any:
    instantiate = getattr(type(prior), "instantiate", None)
    return prior.instantiate() if instantiate is not None else prior


def in_support(prior: Any, value: Array) -> Array | None:
    """Boolean array of the prior's batch shape (is each value in the support?),
    or `None` when the support is unknown (then the library's own answer
    stands)."""
    raw = _raw(prior)
    support = getattr(raw, "support", None)
    if support is not None and type(support).__module__.startswith("numpyro"):
        return jnp.asarray(support(value))
    rule = _RULES.get(type(raw).__name__)
    return None if rule is None else rule(raw, value)
