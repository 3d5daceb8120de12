"""Wrappers and the libraries' own free functions: numpyro's `kl_divergence` and
`vmap_over` take wrappers (registered through their public APIs); TFP's
`kl_divergence`, which needs a private protocol of its arguments, takes the built
objects, and a wrapper's own `kl_divergence` method takes either. Against the raw
objects."""

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as nd
import pytest
from _processes import run_python
from numpyro.distributions.batch_util import vmap_over
from numpyro.distributions.kl import kl_divergence as numpyro_kl
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions
A, B = jnp.array([0.5, 1.0]), jnp.array([1.0, 2.0])
COV = jnp.array([[2.0, 0.3], [0.3, 1.0]])

# (class, arguments of p, arguments of q): pairs each library has a KL for.
NUMPYRO_PAIRS = [
    (nd.Normal, (A, B), (B, A)),
    (nd.Gamma, (A, B), (B, A)),
    (nd.Dirichlet, (A,), (B,)),
    (nd.MultivariateNormal, (A, COV), (B, jnp.eye(2))),
]
TFP_PAIRS = [
    (tfd.Normal, (A, B), (B, A)),
    (tfd.Gamma, (A, B), (B, A)),
    (distrax.Normal, (A, B), (B, A)),
    (distrax.MultivariateNormalTri, (A, jnp.linalg.cholesky(COV)), (B, jnp.eye(2))),
]


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def _sides(cls, p_args, q_args):
    """(p, q) as wrapped/raw in all four combinations, and the raw reference."""
    raw_p, raw_q = cls(*p_args), cls(*q_args)
    w_p, w_q = ep.FixedDistrax(cls, *p_args), ep.FixedDistrax(cls, *q_args)
    return [(w_p, w_q), (w_p, raw_q), (raw_p, w_q)], (raw_p, raw_q)


@pytest.mark.parametrize("cls, p_args, q_args", NUMPYRO_PAIRS)
def test_numpyro_kl_divergence_takes_wrappers_in_either_position(cls, p_args, q_args):
    pairs, (raw_p, raw_q) = _sides(cls, p_args, q_args)
    expected = numpyro_kl(raw_p, raw_q)
    for p, q in pairs:
        _close(numpyro_kl(p, q), expected)
        _close(jax.jit(lambda a, b: numpyro_kl(a, b))(p, q), expected)


@pytest.mark.parametrize("cls, p_args, q_args", TFP_PAIRS)
def test_tfp_and_distrax_kl_of_wrappers_by_method_or_built_objects(cls, p_args, q_args):
    pairs, (raw_p, raw_q) = _sides(cls, p_args, q_args)
    expected = raw_p.kl_divergence(raw_q)
    w_p, w_q = pairs[0]
    _close(w_p.kl_divergence(w_q), expected)  # the wrapper's method: either kind
    _close(w_p.kl_divergence(raw_q), expected)
    _close(tfd.kl_divergence(w_p.instantiate(), w_q.instantiate()), expected)
    _close(raw_p.kl_divergence(w_q.instantiate()), expected)


def test_gradients_through_numpyro_kl_of_a_wrapper_match_the_raw_ones():
    q = nd.Normal(B, A)
    loss = lambda d: jnp.sum(numpyro_kl(d, q))  # noqa: E731
    grads = eqx.filter_grad(loss)(ep.FixedDistrax(nd.Normal, A, B))
    loc, scale = jax.grad(lambda m, s: loss(nd.Normal(m, s)), argnums=(0, 1))(A, B)
    _close(grads.loc, loc)
    _close(grads.scale, scale)


@pytest.mark.parametrize(
    "p, q",
    [
        (ep.FixedDistrax(nd.Normal, A, B), ep.FixedDistrax(distrax.Normal, B, A)),
        (ep.FixedDistrax(nd.Normal, A, B), distrax.Normal(B, A)),
        (ep.FixedDistrax(nd.Normal, A, B), tfd.Normal(B, A)),
        (ep.FixedDistrax(tfd.Normal, A, B), nd.Normal(B, A)),
        (ep.FixedDistrax(distrax.Normal, A, B), ep.FixedDistrax(nd.Normal, B, A)),
    ],
)
def test_kl_method_across_numpyro_and_distrax_or_tfp_names_both_families(p, q):
    for method in ("kl_divergence", "cross_entropy"):
        with pytest.raises(TypeError, match="numpyro's KL registry.*one library") as e:
            getattr(p, method)(q)
        assert "numpyro.Normal" in str(e.value)


@pytest.mark.parametrize(
    "p, q",
    [
        (ep.FixedDistrax(nd.Normal, A, B), distrax.Normal(B, A)),
        (nd.Normal(A, B), ep.FixedDistrax(tfd.Normal, B, A)),
    ],
)
def test_numpyro_kl_across_families_answers_as_for_the_built_objects(p, q):
    # numpyro's own answer for the pair of objects the wrappers build.
    raw = [x.instantiate() if isinstance(x, ep.FixedDistrax) else x for x in (p, q)]
    with pytest.raises(NotImplementedError):  # the reference
        numpyro_kl(*raw)
    with pytest.raises(NotImplementedError):
        numpyro_kl(p, q)


@pytest.mark.parametrize("axes", [{"loc": 0}, {"scale": 0}, {"loc": 0, "scale": 0}])
def test_numpyro_vmap_over_gives_the_in_axes_of_a_wrapper(axes):
    raw = nd.Normal(jnp.stack([A, B]), jnp.stack([B, A]))
    wrapped = ep.FixedDistrax(nd.Normal, raw.loc, raw.scale)
    log_prob = lambda d: d.log_prob(0.3)  # noqa: E731
    expected = jax.vmap(log_prob, in_axes=(vmap_over(raw, **axes),))(raw)
    got = jax.vmap(log_prob, in_axes=(vmap_over(wrapped, **axes),))(wrapped)
    _close(got, expected)


def test_numpyro_vmap_over_a_name_that_is_not_an_array_argument_is_an_error():
    wrapped = ep.FixedDistrax(nd.Normal, A, B)
    with pytest.raises(TypeError, match="not among its array arguments"):
        vmap_over(wrapped, locc=0)


def test_numpyro_imported_before_eqxprob_dispatches_wrappers_too():
    # The registration happens when eqxprob first wraps a numpyro class, whenever
    # numpyro was imported.
    code = (
        "import jax.numpy as jnp, numpyro.distributions as nd\n"
        "from numpyro.distributions.kl import kl_divergence\n"
        "import eqxprob as ep\n"
        "w = ep.FixedDistrax(nd.Normal, jnp.zeros(()), jnp.ones(()))\n"
        "print(float(kl_divergence(nd.Normal(1.0, 1.0), w)))\n"
    )
    assert run_python("-c", code).stdout.strip() == "0.5"
