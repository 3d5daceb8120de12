"""Constructors for the conformance matrix: every constructible distrax class plus a
selection of TFP-JAX and numpyro distributions and bijectors, nested ones included.

Each case builds its object from a dict of arrays through a `W(cls, *args, **kwargs)`
callable: `W = FixedDistrax` gives the wrapper, `W = RAW` the raw distrax/TFP/numpyro
object built from the very same arrays, which is the independent reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import distrax
import jax
import jax.numpy as jnp
import numpyro.distributions as nd
import numpyro.distributions.transforms as nt
from tensorflow_probability.substrates import jax as tfp


tfd = tfp.distributions
tfb = tfp.bijectors


def RAW(cls: type, *args: Any, **kwargs: Any) -> Any:
    return cls(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Case:
    make: Callable[[dict[str, jax.Array], Callable[..., Any]], Any]
    params: dict[str, Any]
    kind: str  # "dist" or "bij"
    x: Any = None  # bijector input; distributions use a sample of the raw object


def a(*values: float) -> jax.Array:
    """A float32 array; a scalar when given one value."""
    return jnp.asarray(values[0] if len(values) == 1 else values, dtype=jnp.float32)


def _vec(n: int = 3, start: float = 0.2, step: float = 0.3) -> jax.Array:
    return start + step * jnp.arange(n, dtype=jnp.float32)


_TRIL = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.9, 0.0], [-0.4, 0.2, 1.1]], jnp.float32)
_X3 = a(0.3, -0.2, 0.5)


# Module-level callables: static arguments that compare equal across builds.
def _conditioner(x: jax.Array) -> jax.Array:
    return jnp.tanh(x)


def _affine_from_params(params: jax.Array) -> distrax.Bijector:
    return distrax.ScalarAffine(shift=params, scale=jnp.ones_like(params))


def _dist(make, **params):
    return Case(make, params, "dist")


def _bij(make, x=_X3, **params):
    return Case(make, params, "bij", x)


DISTRAX: dict[str, Case] = {
    "Bernoulli": _dist(lambda p, W: W(distrax.Bernoulli, logits=p["l"]), l=_vec()),
    "Beta": _dist(
        lambda p, W: W(distrax.Beta, p["a"], p["b"]), a=_vec(3, 1.5), b=_vec(3, 2.0)
    ),
    "Block": _bij(
        lambda p, W: W(distrax.Block, W(distrax.ScalarAffine, p["s"], p["c"]), 1),
        s=_vec(),
        c=_vec(3, 1.0),
    ),
    "Categorical": _dist(lambda p, W: W(distrax.Categorical, logits=p["l"]), l=_vec(4)),
    "CategoricalUniform": _dist(
        lambda p, W: W(
            distrax.CategoricalUniform, low=p["lo"], high=p["hi"], logits=p["l"]
        ),
        lo=a(-1.0),
        hi=a(2.0),
        l=_vec(4),
    ),
    "Chain": _bij(
        lambda p, W: W(
            distrax.Chain,
            [W(distrax.ScalarAffine, p["s"], p["c"]), W(distrax.Tanh), W(tfb.Exp)],
        ),
        s=_vec(),
        c=_vec(3, 1.0),
    ),
    "Clipped": _dist(
        lambda p, W: W(
            distrax.Clipped, W(distrax.Normal, p["m"], p["s"]), p["lo"], p["hi"]
        ),
        m=_vec(),
        s=_vec(3, 1.0),
        lo=a(-1.0),
        hi=a(1.0),
    ),
    "ClippedLogistic": _dist(
        lambda p, W: W(distrax.ClippedLogistic, p["m"], p["s"], p["lo"], p["hi"]),
        m=_vec(),
        s=_vec(3, 1.0),
        lo=a(-1.0),
        hi=a(1.0),
    ),
    "ClippedNormal": _dist(
        lambda p, W: W(distrax.ClippedNormal, p["m"], p["s"], p["lo"], p["hi"]),
        m=_vec(),
        s=_vec(3, 1.0),
        lo=a(-1.0),
        hi=a(1.0),
    ),
    "Deterministic": _dist(lambda p, W: W(distrax.Deterministic, p["m"]), m=_vec()),
    "DiagLinear": _bij(lambda p, W: W(distrax.DiagLinear, p["d"]), d=_vec(3, 1.0)),
    "DiagPlusLowRankLinear": _bij(
        lambda p, W: W(distrax.DiagPlusLowRankLinear, p["d"], p["u"], p["v"]),
        d=_vec(3, 1.0),
        u=0.1 * jnp.ones((3, 2)),
        v=0.2 * jnp.ones((3, 2)),
    ),
    "Dirichlet": _dist(lambda p, W: W(distrax.Dirichlet, p["c"]), c=_vec(3, 1.5)),
    "EpsilonGreedy": _dist(
        lambda p, W: W(distrax.EpsilonGreedy, p["q"], p["e"]),
        q=a(0.1, 0.7, 0.3),
        e=a(0.1),
    ),
    "Gamma": _dist(
        lambda p, W: W(distrax.Gamma, p["c"], p["r"]), c=_vec(3, 1.5), r=_vec(3, 1.0)
    ),
    "Greedy": _dist(lambda p, W: W(distrax.Greedy, p["q"]), q=a(0.1, 0.7, 0.3)),
    "Gumbel": _dist(
        lambda p, W: W(distrax.Gumbel, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "GumbelCDF": _bij(lambda p, W: W(distrax.GumbelCDF)),
    "Independent": _dist(
        lambda p, W: W(distrax.Independent, W(distrax.Normal, p["m"], p["s"]), 1),
        m=_vec(),
        s=_vec(3, 1.0),
    ),
    "Inverse": _bij(
        lambda p, W: W(distrax.Inverse, W(distrax.ScalarAffine, p["s"], p["c"])),
        s=_vec(),
        c=_vec(3, 1.0),
    ),
    "Joint": _dist(
        lambda p, W: W(
            distrax.Joint,
            {
                "a": W(distrax.Normal, p["m"], p["s"]),
                "b": W(distrax.Categorical, logits=p["l"]),
            },
        ),
        m=a(0.5),
        s=a(1.2),
        l=_vec(4),
    ),
    "Lambda": _bij(
        lambda p, W: W(distrax.Lambda, forward=jnp.tanh, inverse=jnp.arctanh)
    ),
    "Laplace": _dist(
        lambda p, W: W(distrax.Laplace, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "Logistic": _dist(
        lambda p, W: W(distrax.Logistic, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "LogStddevNormal": _dist(
        lambda p, W: W(distrax.LogStddevNormal, p["m"], p["s"]), m=_vec(), s=_vec()
    ),
    "LowerUpperTriangularAffine": _bij(
        lambda p, W: W(distrax.LowerUpperTriangularAffine, p["m"], p["b"]),
        m=_TRIL + 0.1 * _TRIL.T,
        b=_vec(),
    ),
    "MaskedCoupling": _bij(
        lambda p, W: W(
            distrax.MaskedCoupling,
            p["mask"],
            _conditioner,
            _affine_from_params,
            event_ndims=1,
        ),
        mask=jnp.array([True, False, True]),
    ),
    "MixtureOfTwo": _dist(
        lambda p, W: W(
            distrax.MixtureOfTwo,
            p["w"],
            W(distrax.Normal, p["m"], p["s"]),
            W(tfd.Normal, p["m2"], p["s2"]),
        ),
        w=a(0.3),
        m=_vec(),
        s=_vec(3, 1.0),
        m2=_vec(3, -1.0),
        s2=_vec(3, 0.5),
    ),
    "MixtureSameFamily": _dist(
        lambda p, W: W(
            distrax.MixtureSameFamily,
            W(distrax.Categorical, logits=p["l"]),
            W(distrax.Normal, p["m"], p["s"]),
        ),
        l=_vec(3),
        m=_vec(3, -1.0, 1.0),
        s=_vec(3, 0.5),
    ),
    "Multinomial": _dist(
        lambda p, W: W(distrax.Multinomial, p["n"], logits=p["l"]),
        n=a(5.0),
        l=_vec(3),
    ),
    "MultivariateNormalDiag": _dist(
        lambda p, W: W(distrax.MultivariateNormalDiag, p["m"], p["s"]),
        m=_vec(),
        s=_vec(3, 1.0),
    ),
    "MultivariateNormalDiagPlusLowRank": _dist(
        lambda p, W: W(
            distrax.MultivariateNormalDiagPlusLowRank, p["m"], p["d"], p["u"], p["v"]
        ),
        m=_vec(),
        d=_vec(3, 1.0),
        u=0.1 * jnp.ones((3, 2)),
        v=0.2 * jnp.ones((3, 2)),
    ),
    "MultivariateNormalFromBijector": _dist(
        lambda p, W: W(
            distrax.MultivariateNormalFromBijector,
            p["m"],
            W(distrax.DiagLinear, p["d"]),
        ),
        m=_vec(),
        d=_vec(3, 1.0),
    ),
    "MultivariateNormalFullCovariance": _dist(
        lambda p, W: W(distrax.MultivariateNormalFullCovariance, p["m"], p["c"]),
        m=_vec(),
        c=_TRIL @ _TRIL.T,
    ),
    "MultivariateNormalTri": _dist(
        lambda p, W: W(distrax.MultivariateNormalTri, p["m"], p["t"]),
        m=_vec(),
        t=_TRIL,
    ),
    "Normal": _dist(
        lambda p, W: W(distrax.Normal, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "OneHotCategorical": _dist(
        lambda p, W: W(distrax.OneHotCategorical, logits=p["l"]), l=_vec(4)
    ),
    "Quantized": _dist(
        lambda p, W: W(
            distrax.Quantized, W(distrax.Normal, p["m"], p["s"]), p["lo"], p["hi"]
        ),
        m=_vec(3, 1.0),
        s=_vec(3, 2.0),
        lo=a(-3.0),
        hi=a(5.0),
    ),
    "RationalQuadraticSpline": _bij(
        lambda p, W: W(distrax.RationalQuadraticSpline, p["p"], -2.0, 2.0),
        p=jnp.linspace(-0.5, 0.5, 3 * 13).reshape(3, 13),
    ),
    "ScalarAffine": _bij(
        lambda p, W: W(distrax.ScalarAffine, p["s"], log_scale=p["c"]),
        s=_vec(),
        c=_vec(),
    ),
    "Shift": _bij(lambda p, W: W(distrax.Shift, p["s"]), s=_vec()),
    "Sigmoid": _bij(lambda p, W: W(distrax.Sigmoid)),
    "Softmax": _dist(
        lambda p, W: W(distrax.Softmax, p["l"], temperature=p["t"]),
        l=_vec(4),
        t=a(0.5),
    ),
    "SplitCoupling": _bij(
        lambda p, W: W(distrax.SplitCoupling, 2, 1, _conditioner, _affine_from_params),
        x=a(0.3, -0.2, 0.5, 0.1),
    ),
    "Tanh": _bij(lambda p, W: W(distrax.Tanh)),
    "Transformed": _dist(
        lambda p, W: W(
            distrax.Transformed,
            W(distrax.Normal, p["m"], p["s"]),
            W(distrax.ScalarAffine, p["c"], p["k"]),
        ),
        m=_vec(),
        s=_vec(3, 1.0),
        c=a(0.5),
        k=a(2.0),
    ),
    "TriangularLinear": _bij(lambda p, W: W(distrax.TriangularLinear, p["m"]), m=_TRIL),
    "UnconstrainedAffine": _bij(
        lambda p, W: W(distrax.UnconstrainedAffine, p["m"], p["b"]),
        m=_TRIL + 0.1 * _TRIL.T,
        b=_vec(),
    ),
    "Uniform": _dist(
        lambda p, W: W(distrax.Uniform, p["lo"], p["hi"]),
        lo=_vec(3, -1.0),
        hi=_vec(3, 2.0),
    ),
    "VonMises": _dist(
        lambda p, W: W(distrax.VonMises, p["m"], p["c"]), m=_vec(), c=_vec(3, 1.0)
    ),
}

TFP_DISTRIBUTIONS: dict[str, Case] = {
    "tfd.Normal": _dist(
        lambda p, W: W(tfd.Normal, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "tfd.LogNormal": _dist(
        lambda p, W: W(tfd.LogNormal, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "tfd.Gamma": _dist(
        lambda p, W: W(tfd.Gamma, p["c"], p["r"]), c=_vec(3, 1.5), r=_vec(3, 1.0)
    ),
    "tfd.InverseGamma": _dist(
        lambda p, W: W(tfd.InverseGamma, p["c"], p["r"]),
        c=_vec(3, 1.5),
        r=_vec(3, 1.0),
    ),
    "tfd.Beta": _dist(
        lambda p, W: W(tfd.Beta, p["a"], p["b"]), a=_vec(3, 1.5), b=_vec(3, 2.0)
    ),
    "tfd.Exponential": _dist(lambda p, W: W(tfd.Exponential, p["r"]), r=_vec()),
    "tfd.StudentT": _dist(
        lambda p, W: W(tfd.StudentT, p["df"], p["m"], p["s"]),
        df=_vec(3, 3.0),
        m=_vec(),
        s=_vec(3, 1.0),
    ),
    "tfd.Cauchy": _dist(
        lambda p, W: W(tfd.Cauchy, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "tfd.Laplace": _dist(
        lambda p, W: W(tfd.Laplace, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "tfd.HalfNormal": _dist(lambda p, W: W(tfd.HalfNormal, p["s"]), s=_vec(3, 1.0)),
    "tfd.Poisson": _dist(lambda p, W: W(tfd.Poisson, rate=p["r"]), r=_vec(3, 1.0)),
    "tfd.Bernoulli": _dist(lambda p, W: W(tfd.Bernoulli, logits=p["l"]), l=_vec()),
    "tfd.Categorical": _dist(lambda p, W: W(tfd.Categorical, logits=p["l"]), l=_vec(4)),
    "tfd.Dirichlet": _dist(lambda p, W: W(tfd.Dirichlet, p["c"]), c=_vec(3, 1.5)),
    "tfd.Uniform": _dist(
        lambda p, W: W(tfd.Uniform, p["lo"], p["hi"]),
        lo=_vec(3, -1.0),
        hi=_vec(3, 2.0),
    ),
    "tfd.Weibull": _dist(
        lambda p, W: W(tfd.Weibull, p["k"], p["s"]), k=_vec(3, 1.5), s=_vec(3, 1.0)
    ),
    "tfd.Gumbel": _dist(
        lambda p, W: W(tfd.Gumbel, p["m"], p["s"]), m=_vec(), s=_vec(3, 1.0)
    ),
    "tfd.VonMises": _dist(
        lambda p, W: W(tfd.VonMises, p["m"], p["c"]), m=_vec(), c=_vec(3, 1.0)
    ),
    "tfd.TruncatedNormal": _dist(
        lambda p, W: W(tfd.TruncatedNormal, p["m"], p["s"], p["lo"], p["hi"]),
        m=_vec(),
        s=_vec(3, 1.0),
        lo=a(-1.0),
        hi=a(2.0),
    ),
    "tfd.MultivariateNormalTriL": _dist(
        lambda p, W: W(tfd.MultivariateNormalTriL, p["m"], p["t"]), m=_vec(), t=_TRIL
    ),
    "tfd.MultivariateNormalDiag": _dist(
        lambda p, W: W(tfd.MultivariateNormalDiag, p["m"], p["s"]),
        m=_vec(),
        s=_vec(3, 1.0),
    ),
    "tfd.Independent": _dist(
        lambda p, W: W(tfd.Independent, W(tfd.Normal, p["m"], p["s"]), 1),
        m=_vec(),
        s=_vec(3, 1.0),
    ),
    "tfd.TransformedDistribution": _dist(
        lambda p, W: W(
            tfd.TransformedDistribution,
            W(tfd.Normal, p["m"], p["s"]),
            W(tfb.Chain, [W(tfb.Shift, p["c"]), W(tfb.Exp)]),
        ),
        m=_vec(),
        s=_vec(3, 1.0),
        c=a(0.5),
    ),
    "tfd.MixtureSameFamily": _dist(
        lambda p, W: W(
            tfd.MixtureSameFamily,
            W(tfd.Categorical, logits=p["l"]),
            W(tfd.Normal, p["m"], p["s"]),
        ),
        l=_vec(3),
        m=_vec(3, -1.0, 1.0),
        s=_vec(3, 0.5),
    ),
}

TFP_BIJECTORS: dict[str, Case] = {
    "tfb.Exp": _bij(lambda p, W: W(tfb.Exp)),
    "tfb.Softplus": _bij(
        lambda p, W: W(tfb.Softplus, hinge_softness=p["h"]), h=_vec(3, 0.5)
    ),
    "tfb.Sigmoid": _bij(
        lambda p, W: W(tfb.Sigmoid, low=p["lo"], high=p["hi"]), lo=a(-1.0), hi=a(3.0)
    ),
    "tfb.Shift": _bij(lambda p, W: W(tfb.Shift, p["s"]), s=_vec()),
    "tfb.Scale": _bij(lambda p, W: W(tfb.Scale, p["s"]), s=_vec(3, 1.0)),
    "tfb.Scale(log_scale)": _bij(lambda p, W: W(tfb.Scale, log_scale=p["s"]), s=_vec()),
    "tfb.Tanh": _bij(lambda p, W: W(tfb.Tanh)),
    "tfb.ScaleMatvecTriL": _bij(lambda p, W: W(tfb.ScaleMatvecTriL, p["t"]), t=_TRIL),
    "tfb.FillScaleTriL": _bij(
        lambda p, W: W(tfb.FillScaleTriL, diag_shift=p["d"]),
        x=_vec(6, -0.5, 0.2),
        d=a(1e-3),
    ),
    "tfb.SoftmaxCentered": _bij(lambda p, W: W(tfb.SoftmaxCentered)),
    "tfb.Invert": _bij(lambda p, W: W(tfb.Invert, W(tfb.Softplus)), x=_vec(3, 0.5)),
    "tfb.Chain": _bij(
        lambda p, W: W(
            tfb.Chain, [W(tfb.Shift, p["s"]), W(tfb.Scale, p["c"]), W(tfb.Exp)]
        ),
        s=_vec(),
        c=_vec(3, 1.0),
    ),
}


def _nd(name: str, make, **params) -> tuple[str, Case]:
    return f"nd.{name}", _dist(make, **params)


def _nt(name: str, make, x=_X3, **params) -> tuple[str, Case]:
    return f"nt.{name}", _bij(make, x, **params)


NUMPYRO_DISTRIBUTIONS: dict[str, Case] = dict(
    [
        _nd(
            "Normal",
            lambda p, W: W(nd.Normal, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "LogNormal",
            lambda p, W: W(nd.LogNormal, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "Gamma",
            lambda p, W: W(nd.Gamma, p["c"], rate=p["r"]),
            c=_vec(3, 1.5),
            r=_vec(3, 1.0),
        ),
        _nd(
            "InverseGamma",
            lambda p, W: W(nd.InverseGamma, p["c"], p["r"]),
            c=_vec(3, 1.5),
            r=_vec(3, 1.0),
        ),
        _nd(
            "Beta",
            lambda p, W: W(nd.Beta, p["a"], p["b"]),
            a=_vec(3, 1.5),
            b=_vec(3, 2.0),
        ),
        _nd("Exponential", lambda p, W: W(nd.Exponential, p["r"]), r=_vec()),
        _nd(
            "StudentT",
            lambda p, W: W(nd.StudentT, p["df"], p["m"], p["s"]),
            df=_vec(3, 3.0),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "Cauchy",
            lambda p, W: W(nd.Cauchy, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "Laplace",
            lambda p, W: W(nd.Laplace, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "Logistic",
            lambda p, W: W(nd.Logistic, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "Gumbel",
            lambda p, W: W(nd.Gumbel, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd("HalfNormal", lambda p, W: W(nd.HalfNormal, p["s"]), s=_vec(3, 1.0)),
        _nd("HalfCauchy", lambda p, W: W(nd.HalfCauchy, p["s"]), s=_vec(3, 1.0)),
        _nd("Chi2", lambda p, W: W(nd.Chi2, p["df"]), df=_vec(3, 2.0)),
        _nd(
            "Weibull",
            lambda p, W: W(nd.Weibull, p["s"], p["k"]),
            s=_vec(3, 1.0),
            k=_vec(3, 1.5),
        ),
        _nd(
            "Pareto",
            lambda p, W: W(nd.Pareto, p["s"], p["a"]),
            s=_vec(3, 1.0),
            a=_vec(3, 2.0),
        ),
        _nd(
            "Uniform",
            lambda p, W: W(nd.Uniform, p["lo"], p["hi"]),
            lo=_vec(3, -1.0),
            hi=_vec(3, 2.0),
        ),
        _nd(
            "VonMises",
            lambda p, W: W(nd.VonMises, p["m"], p["c"]),
            m=_vec(),
            c=_vec(3, 1.0),
        ),
        _nd("Poisson", lambda p, W: W(nd.Poisson, p["r"]), r=_vec(3, 1.0)),
        # An array argument named like the forwarded `mean` method.
        _nd(
            "NegativeBinomial2",
            lambda p, W: W(nd.NegativeBinomial2, mean=p["m"], concentration=p["c"]),
            m=_vec(3, 1.5),
            c=_vec(3, 2.0),
        ),
        _nd(
            "BetaProportion",
            lambda p, W: W(nd.BetaProportion, p["m"], p["c"]),
            m=_vec(3, 0.2, 0.25),
            c=_vec(3, 3.0),
        ),
        _nd("BernoulliLogits", lambda p, W: W(nd.BernoulliLogits, p["l"]), l=_vec()),
        _nd(
            "BinomialLogits",
            lambda p, W: W(nd.BinomialLogits, p["l"], total_count=5),
            l=_vec(),
        ),
        _nd(
            "CategoricalLogits", lambda p, W: W(nd.CategoricalLogits, p["l"]), l=_vec(4)
        ),
        _nd("Dirichlet", lambda p, W: W(nd.Dirichlet, p["c"]), c=_vec(3, 1.5)),
        _nd(
            "MultivariateNormal",
            lambda p, W: W(nd.MultivariateNormal, p["m"], scale_tril=p["t"]),
            m=_vec(),
            t=_TRIL,
        ),
        _nd(
            "LowRankMultivariateNormal",
            lambda p, W: W(nd.LowRankMultivariateNormal, p["m"], p["u"], p["d"]),
            m=_vec(),
            u=0.1 * jnp.ones((3, 2)),
            d=_vec(3, 1.0),
        ),
        _nd(
            "Independent",
            lambda p, W: W(nd.Independent, W(nd.Normal, p["m"], p["s"]), 1),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nd(
            "TransformedDistribution",
            lambda p, W: W(
                nd.TransformedDistribution,
                W(nd.Normal, p["m"], p["s"]),
                [W(nt.AffineTransform, p["c"], p["k"]), W(nt.ExpTransform)],
            ),
            m=_vec(),
            s=_vec(3, 1.0),
            c=a(0.5),
            k=a(2.0),
        ),
        _nd(
            "MixtureSameFamily",
            lambda p, W: W(
                nd.MixtureSameFamily,
                W(nd.CategoricalLogits, p["l"]),
                W(nd.Normal, p["m"], p["s"]),
            ),
            l=_vec(3),
            m=_vec(3, -1.0, 1.0),
            s=_vec(3, 0.5),
        ),
        _nd(
            "ExpandedDistribution",
            lambda p, W: W(
                nd.ExpandedDistribution, W(nd.Normal, p["m"], p["s"]), (2, 3)
            ),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
    ]
)

NUMPYRO_TRANSFORMS: dict[str, Case] = dict(
    [
        _nt("ExpTransform", lambda p, W: W(nt.ExpTransform)),
        _nt(
            "AffineTransform",
            lambda p, W: W(nt.AffineTransform, p["m"], p["s"]),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
        _nt("SigmoidTransform", lambda p, W: W(nt.SigmoidTransform)),
        _nt("SoftplusTransform", lambda p, W: W(nt.SoftplusTransform)),
        _nt(
            "PowerTransform",
            lambda p, W: W(nt.PowerTransform, p["e"]),
            x=_vec(3, 0.5),
            e=_vec(3, 1.5),
        ),
        _nt("StickBreakingTransform", lambda p, W: W(nt.StickBreakingTransform)),
        _nt(
            "LowerCholeskyTransform",
            lambda p, W: W(nt.LowerCholeskyTransform),
            x=_vec(6, -0.5, 0.2),
        ),
        _nt("CorrCholeskyTransform", lambda p, W: W(nt.CorrCholeskyTransform)),
        _nt("OrderedTransform", lambda p, W: W(nt.OrderedTransform)),
        _nt(
            "ComposeTransform",
            lambda p, W: W(
                nt.ComposeTransform,
                [W(nt.AffineTransform, p["m"], p["s"]), W(nt.ExpTransform)],
            ),
            m=_vec(),
            s=_vec(3, 1.0),
        ),
    ]
)

CASES: dict[str, Case] = {
    **DISTRAX,
    **TFP_DISTRIBUTIONS,
    **TFP_BIJECTORS,
    **NUMPYRO_DISTRIBUTIONS,
    **NUMPYRO_TRANSFORMS,
}


# Public distrax names that are not constructible distributions or bijectors.
def _i(*values: int) -> jax.Array:
    return jnp.asarray(values, dtype=jnp.int32)


# The point where the conformance tests evaluate a distribution case is a sample
# of the raw distribution, except for these, whose samplers (gamma-based, rejection
# loops) would cost most of the matrix's compile time: a point of each support,
# of the sample's shape and dtype (checked there).
_UNIT, _POSITIVE, _REAL = a(0.3, 0.5, 0.7), a(0.5, 1.2, 2.5), a(0.3, -1.5, 2.0)
INPUTS: dict[str, jax.Array] = {
    **dict.fromkeys(["Beta", "tfd.Beta", "nd.Beta", "nd.BetaProportion"], _UNIT),
    **dict.fromkeys(
        "Gamma tfd.Gamma nd.Gamma tfd.InverseGamma nd.InverseGamma nd.Chi2".split(),
        _POSITIVE,
    ),
    **dict.fromkeys(["tfd.StudentT", "nd.StudentT", "tfd.TruncatedNormal"], _REAL / 2),
    **dict.fromkeys(["Dirichlet", "tfd.Dirichlet", "nd.Dirichlet"], a(0.2, 0.3, 0.5)),
    **dict.fromkeys(["VonMises", "tfd.VonMises", "nd.VonMises"], _REAL),
    "tfd.Poisson": a(0.0, 1.0, 3.0),
    "nd.Poisson": _i(0, 1, 3),
    "nd.NegativeBinomial2": _i(0, 2, 5),
    "nd.BinomialLogits": _i(0, 2, 5),
    "Multinomial": _i(2, 1, 2),
}


DISTRAX_NOT_CONSTRUCTIBLE = {
    "Bijector": "abstract base class",
    "Distribution": "abstract base class",
    "Linear": "abstract base class",
    "BijectorLike": "type alias",
    "DistributionLike": "type alias",
    "HMM": "not a distribution or bijector (a helper class); unsupported",
}

# Classes whose own code is not strict-clean under
# `jax_numpy_dtype_promotion="strict"` (tests/conftest.py): the upstream line
# that mixes dtypes. Their conformance tests run under standard promotion.
NOT_STRICT_UPSTREAM = {
    "Bernoulli": "distrax/_src/utils/math.py:45 (int32 * bool)",
    "OneHotCategorical": "distrax/_src/utils/math.py:45 (int32 * bool)",
    "Multinomial": "distrax/_src/distributions/multinomial.py:145",
    "Greedy": "distrax/_src/distributions/greedy.py:31 (int32 + bool)",
    "EpsilonGreedy": "distrax/_src/distributions/epsilon_greedy.py:31",
    "RationalQuadraticSpline": "distrax/_src/bijectors/rational_quadratic_spline.py:80",
    "nd.BernoulliLogits": "numpyro/distributions/discrete.py:250",
    "nd.BinomialLogits": "numpyro/distributions/util.py:186",
    "tfd.StudentT": "tfp/python/internal/backend/jax/numpy_math.py:293",
}

# Classes whose own code asks for float64 without x64 (JAX then warns that it
# truncates to float32): the upstream place. Their conformance tests ignore
# exactly that warning.
FLOAT64_WARNING_UPSTREAM = {
    "tfd.Poisson": "tensorflow_probability/python/internal/backend/jax/ops.py:341",
    "tfd.StudentT": "tensorflow_probability/python/internal/backend/jax/ops.py:408",
}


# numpyro distributions whose `__init__` builds other distributions from the
# arguments, whose own checks reject them (Wishart's `WishartCholesky`,
# `LKJCholesky`'s `Beta`, ...): name -> (class, valid kwargs, rejected kwargs).
# Found by the red team of the compiled numpyro check. (Their builds mix dtypes:
# run them under standard promotion.)
_L3 = jnp.array([[1.2, 0.0, 0.0], [0.3, 0.9, 0.0], [-0.4, 0.2, 1.1]])
_S3 = _L3 @ _L3.T
_NOT_PD = _S3.at[0, 0].set(-1.0)  # symmetric, negative first diagonal entry
_BAD_CHOL = jnp.eye(2).at[0, 0].set(-1.0)  # neither a correlation Cholesky factor
_COPULA = dict(concentration1=jnp.ones(2), concentration0=jnp.ones(2))


def _wishart(cls: type, name: str, good: jax.Array, bad: jax.Array) -> tuple:
    five = dict(concentration=a(5.0))
    return cls, five | {name: good}, five | {name: bad}


NUMPYRO_INNER_CHECKS: dict[str, tuple[type, dict, dict]] = {
    "Wishart scale_matrix": _wishart(nd.Wishart, "scale_matrix", _S3, _NOT_PD),
    "Wishart scale_tril": _wishart(
        nd.Wishart, "scale_tril", _L3, _L3.at[0, 0].set(-1.0)
    ),
    "Wishart rate_matrix": _wishart(nd.Wishart, "rate_matrix", _S3, _NOT_PD),
    "InverseWishart scale_matrix": _wishart(
        nd.InverseWishart, "scale_matrix", _S3, _NOT_PD
    ),
    "GaussianCopulaBeta correlation_cholesky": (
        nd.GaussianCopulaBeta,
        _COPULA | dict(correlation_cholesky=jnp.eye(2)),
        _COPULA | dict(correlation_cholesky=_BAD_CHOL),
    ),
    "GaussianCopulaBeta correlation_matrix": (
        nd.GaussianCopulaBeta,
        _COPULA | dict(correlation_matrix=jnp.eye(2)),
        _COPULA | dict(correlation_matrix=_BAD_CHOL),
    ),
    "NegativeBinomialLogits logits=100": (  # the rate exp(-100) is 0 in float32
        nd.NegativeBinomialLogits,
        dict(total_count=a(3.0), logits=a(1.0)),
        dict(total_count=a(3.0), logits=a(100.0)),
    ),
    "NegativeBinomialProbs probs=-0.0": (
        nd.NegativeBinomialProbs,
        dict(total_count=a(3.0), probs=a(0.3)),
        dict(total_count=a(3.0), probs=a(-0.0)),
    ),
    "RelaxedBernoulliLogits temperature=inf": (  # Logistic scale 1/inf = 0
        nd.RelaxedBernoulliLogits,
        dict(temperature=a(1.0), logits=a(2.0)),
        dict(temperature=a(jnp.inf), logits=a(2.0)),
    ),
    "LKJCholesky concentration=1e-10": (
        nd.LKJCholesky,
        dict(dimension=3, concentration=a(1.0)),
        dict(dimension=3, concentration=a(1e-10)),
    ),
    "LKJ concentration=1e-10": (
        nd.LKJ,
        dict(dimension=3, concentration=a(1.0)),
        dict(dimension=3, concentration=a(1e-10)),
    ),
    "GaussianStateSpace covariance_matrix=inf": (
        nd.GaussianStateSpace,
        dict(
            num_steps=3,
            transition_matrix=0.5 * jnp.eye(2),
            covariance_matrix=jnp.eye(2),
        ),
        dict(
            num_steps=3,
            transition_matrix=0.5 * jnp.eye(2),
            covariance_matrix=jnp.eye(2).at[0, 0].set(jnp.inf),
        ),
    ),
}
