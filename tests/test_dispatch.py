"""Wrappers inside the libraries' own dispatch: numpyro's `kl_divergence` and
`vmap_over`, TFP's KL registry (also distrax's), against the raw objects."""

import subprocess
import sys

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as nd
import pytest
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
def test_tfp_and_distrax_kl_take_wrappers_in_either_position(cls, p_args, q_args):
    pairs, (raw_p, raw_q) = _sides(cls, p_args, q_args)
    expected = raw_p.kl_divergence(raw_q)
    for p, q in pairs:
        _close(tfd.kl_divergence(p, q), expected)
        _close(p.kl_divergence(q), expected)  # a raw p's own method included


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
        (nd.Normal(A, B), ep.FixedDistrax(tfd.Normal, B, A)),
        (tfd.Normal(A, B), ep.FixedDistrax(nd.Normal, B, A)),
        (distrax.Normal(A, B), ep.FixedDistrax(nd.Normal, B, A)),
    ],
)
def test_kl_across_numpyro_and_distrax_or_tfp_names_both_families(p, q):
    kl = numpyro_kl if isinstance(p, nd.Distribution) else tfd.kl_divergence
    if isinstance(p, ep.FixedDistrax) and p.cls.__module__.startswith("numpyro"):
        kl = numpyro_kl
    for call in (kl, lambda a, b: a.kl_divergence(b)):
        if call is not kl and isinstance(p, nd.Distribution):
            continue  # (a raw numpyro distribution has no kl_divergence method)
        with pytest.raises(TypeError, match="numpyro.Normal") as info:
            call(p, q)
        assert "Normal" in str(info.value).replace("numpyro.Normal", "")


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
    code = (
        "import jax.numpy as jnp, numpyro.distributions as nd, distrax\n"
        "from numpyro.distributions.kl import kl_divergence\n"
        "import eqxprob as ep\n"
        "w = ep.FixedDistrax(distrax.Normal, jnp.zeros(()), jnp.ones(()))\n"
        "try:\n"
        "    kl_divergence(nd.Normal(0.0, 1.0), w)\n"
        "except TypeError as e:\n"
        "    print('TypeError', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "TypeError" in out.stdout and "numpyro.Normal" in out.stdout, out.stderr
