"""Guides and the ELBO against independent references: closed-form ELBOs and
posteriors of conjugate Gaussian models, hand-written Monte Carlo, numpyro's
`AutoNormal` + `Trace_ELBO`."""

from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as nd
import optax
import pytest
from _compiles import Compilations
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions


RNG = np.random.default_rng(0)
X = RNG.normal(size=(20, 2))
THETA = np.array([0.7, -1.2])
SIGMA, TAU = 0.5, 2.0
Y = X @ THETA + SIGMA * RNG.normal(size=20)


class Regression(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, TAU))


def _loglik(x, y):
    return lambda m: jnp.sum(distrax.Normal(x @ m.w, SIGMA).log_prob(y))


def _posterior():
    prec = X.T @ X / SIGMA**2 + np.eye(2) / TAU**2
    cov = np.linalg.inv(prec)
    return cov @ X.T @ Y / SIGMA**2, cov


def _exact_elbo(m, s_cov, x, y, scale=1.0, tau=TAU):
    """E_q[log N(y; x w, σ²)]·scale − KL(N(m, S) || N(0, τ² I)), in closed form."""
    n, d = x.shape
    resid = y - x @ m
    ell = -0.5 * n * np.log(2 * np.pi * SIGMA**2) - (
        resid @ resid + np.trace(x @ s_cov @ x.T)
    ) / (2 * SIGMA**2)
    kl = 0.5 * (
        np.trace(s_cov) / tau**2
        + m @ m / tau**2
        - d
        + d * np.log(tau**2)
        - np.linalg.slogdet(s_cov)[1]
    )
    return scale * ell - kl


def _cov(q):
    scale = ep.resolve(q.scale)
    if q.family == "mean_field":
        return np.diag(np.asarray(scale) ** 2)
    if q.family == "full_rank":
        return np.asarray(scale @ scale.T)
    diag, u, v = scale
    s = jnp.diag(diag) + u @ v.T
    return np.asarray(s @ s.T)


@pytest.mark.parametrize(
    "family",
    ["mean_field", "full_rank", pytest.param("low_rank", marks=pytest.mark.slow)],
)
def test_elbo_estimates_the_closed_form_elbo(family):
    with jax.enable_x64(True):
        q = ep.guide(Regression(jnp.array([0.3, -0.5])), family, init_scale=0.3)
        q = eqx.tree_at(lambda g: g.loc, q, jnp.array([0.5, -1.0]))
        for analytic in (True, False):
            estimate = ep.elbo(
                q,
                _loglik(X, Y),
                jax.random.key(0),
                num_samples=20_000,
                analytic=analytic,
            )
            exact = _exact_elbo(np.asarray(q.loc), _cov(q), X, Y)
            np.testing.assert_allclose(estimate, exact, rtol=2e-3)


X3 = RNG.normal(size=(20, 3))
Y3 = X3 @ np.array([0.5, -1.0, 2.0]) + SIGMA * RNG.normal(size=20)

# Normal priors whose loc and scale broadcast to the parameter's shape, of each
# library, raw and wrapped (a wrapped one crashed `elbo`).
BROADCASTING = {
    "distrax": lambda: distrax.Normal(jnp.zeros(3), 3.0),
    "tfd": lambda: tfd.Normal(jnp.zeros(3), 3.0),
    "numpyro": lambda: nd.Normal(jnp.zeros(3), 3.0),
}


@pytest.mark.parametrize("wrapped", [False, True], ids=["raw", "wrapped"])
@pytest.mark.parametrize("library", list(BROADCASTING))
def test_elbo_with_a_broadcasting_normal_prior_raw_or_wrapped(library, wrapped):
    with jax.enable_x64(True):
        prior = BROADCASTING[library]()
        if wrapped:
            prior = ep.FixedDistrax.from_instance(prior)

        class Vector(eqx.Module):
            w: jax.Array = ep.field(prior=prior)

        q = ep.guide(Vector(jnp.array([0.3, -0.5, 1.0])), "full_rank", init_scale=0.3)
        estimate = ep.elbo(q, _loglik(X3, Y3), jax.random.key(0), num_samples=20_000)
        exact = _exact_elbo(np.asarray(q.loc), _cov(q), X3, Y3, tau=3.0)
        np.testing.assert_allclose(estimate, exact, rtol=2e-3)


@pytest.mark.parametrize("wrapped", [False, True], ids=["raw", "wrapped"])
@pytest.mark.parametrize(
    "base", [distrax.Normal, tfd.Normal, nd.Normal], ids=["distrax", "tfd", "numpyro"]
)
def test_a_subclass_named_normal_takes_the_sampled_prior_term(base, wrapped):
    """A user's tempered prior, a subclass called `Normal` with its own `log_prob`:
    the closed form is for the libraries' own Normal classes only (by class, not
    name), so its term is sampled, with its own density: hand-written Monte Carlo
    on the guide's own draws."""

    class Normal(base):
        def log_prob(self, value):
            return 0.5 * super().log_prob(value)

    prior = ep.FixedDistrax(Normal, 0.0, TAU) if wrapped else Normal(0.0, TAU)

    class Line(eqx.Module):
        w: jax.Array = ep.field(prior=prior)

    q = ep.guide(Line(jnp.array([0.5, -1.0])), init_scale=0.3)
    key, n = jax.random.key(0), 8
    ours = ep.elbo(q, _loglik(X, Y), key, num_samples=n)
    draws = q.distribution.sample(seed=key, sample_shape=(n,))  # as `elbo` draws
    x, y = jnp.asarray(X, jnp.float32), jnp.asarray(Y, jnp.float32)
    loglik = jax.vmap(lambda w: jnp.sum(distrax.Normal(x @ w, SIGMA).log_prob(y)))
    tempered = 0.5 * jnp.sum(distrax.Normal(0.0, TAU).log_prob(draws), -1)
    entropy = 2 * (0.5 * np.log(2 * np.pi * np.e) + np.log(0.3))
    np.testing.assert_allclose(
        ours, jnp.mean(loglik(draws) + tempered) + entropy, rtol=1e-5
    )


def test_minibatch_elbo_is_unbiased_for_the_full_data_elbo():
    with jax.enable_x64(True):
        q = ep.guide(Regression(jnp.array([0.5, -1.0])), "full_rank", init_scale=0.2)
        n, b = X.shape[0], 5

        @jax.jit
        def minibatch(key):
            rows_key, sample_key = jax.random.split(key)
            rows = jax.random.randint(rows_key, (b,), 0, n)  # as `ep.fit` draws
            ll = _loglik(jnp.asarray(X)[rows], jnp.asarray(Y)[rows])
            return ep.elbo(q, ll, sample_key, likelihood_scale=n / b)

        values = jax.vmap(minibatch)(jax.random.split(jax.random.key(1), 20_000))
        exact = _exact_elbo(np.asarray(q.loc), _cov(q), X, Y)
        se = np.std(values) / np.sqrt(values.size)
        assert abs(np.mean(values) - exact) < 4 * se
        assert se < 0.05 * abs(exact)  # the check is sharp enough to fail


@pytest.mark.slow
def test_full_rank_optimum_is_the_exact_posterior():
    """Conjugate model: adam, then SGD with many samples to quiet the noise."""
    with jax.enable_x64(True):

        def loss(samples):
            def f(q, key):
                return -ep.elbo(q, _loglik(X, Y), key, num_samples=samples)

            return f

        q = ep.guide(Regression(jnp.zeros(2)), "full_rank")
        schedule = optax.exponential_decay(0.05, 3000, 0.01)
        common: dict[str, Any] = dict(progress=False, key=jax.random.key(0))
        q, _ = ep.fit(q, loss(16), optimiser=optax.adam(schedule), steps=3000, **common)
        schedule = optax.exponential_decay(2e-3, 3000, 0.05)
        q, _ = ep.fit(
            q, loss(2048), optimiser=optax.sgd(schedule), steps=3000, **common
        )
        mean, cov = _posterior()
        np.testing.assert_allclose(q.loc, mean, atol=1e-3)
        np.testing.assert_allclose(_cov(q), cov, atol=1e-3)
        np.testing.assert_allclose(q.mean().w, mean, atol=1e-3)


@pytest.mark.slow
def test_guides_of_equal_models_share_their_compiled_fit():
    """A fresh guide of an equal model traces to the same program as the last
    one and reuses its compiled fit; one of another start trains with it to its
    own (closed-form) optimum. (The very first fit of a guide also traces the
    wrapped priors' one-time validation, dead code that later traces skip, so
    the guides after it are the ones compared.)"""
    # (JAX arrays, not the NumPy `X`, `Y`: jax 0.10.2 remembers a NumPy constant
    # of a `jax.jit` converted under float32 and gives it to later traces under
    # `enable_x64` too, which breaks the float64 tests after this one.)
    x, y = jnp.asarray(X, jnp.float32), jnp.asarray(Y, jnp.float32)

    def loss(q, key):
        return -ep.elbo(q, _loglik(x, y), key, num_samples=16)

    kw: dict[str, Any] = dict(optimiser=optax.adam(0.05), steps=600, progress=False)
    mean, _ = _posterior()
    starts = (jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.array([5.0, -5.0]))
    for i, start in enumerate(starts):
        with Compilations() as c:
            q = ep.guide(Regression(start))
            q, _ = ep.fit(q, loss, key=jax.random.key(0), **kw)
        np.testing.assert_allclose(q.loc, mean, atol=0.1)
        if i >= 2:  # a fresh guide of an equal model, of another start
            assert c.count == 0
    assert hash(ep.guide(Regression(jnp.zeros(2))).randoms) == hash(q.randoms)  # pyright: ignore[reportPossiblyUnboundVariable]


class Rate(eqx.Module):
    rate: jax.Array = ep.field(
        constraint=ep.constraints.positive, prior=distrax.Gamma(3.0, 2.0)
    )
    offset: jax.Array  # pyright: ignore[reportGeneralTypeIssues]  (no prior: a point estimate; `ep.field` sets no default)
    period: jax.Array = ep.field(
        constraint=ep.constraints.positive,
        trainable=False,
        prior=distrax.Gamma(2.0, 1.0),
    )


def test_constrained_parameters_sample_with_the_model_structure():
    model = Rate(jnp.array([1.5, 0.5]), jnp.array(0.3), jnp.array(2.0))
    q = ep.guide(model, init_scale=0.5)
    assert q.loc.shape == (2,)  # only `rate` is random
    draws = q.sample(jax.random.key(0), 500)
    assert draws.rate.shape == (500, 2) and bool(jnp.all(draws.rate > 0))
    assert draws.offset.shape == (500,) and bool(jnp.all(draws.offset == 0.3))
    assert bool(jnp.all(draws.period == 2.0))
    # Each draw is softplus of a Gaussian: compare with hand-written quantiles.
    u = jax.random.normal(jax.random.key(1), (200_000, 2)) * 0.5 + q.loc
    np.testing.assert_allclose(
        np.median(draws.rate, 0), np.median(jax.nn.softplus(u), 0), rtol=0.1
    )
    np.testing.assert_allclose(q.mean().rate, model.rate, rtol=1e-6)
    # log_prob is the Gaussian density of the unconstrained values
    expected = distrax.MultivariateNormalDiag(q.loc, jnp.full(2, 0.5)).log_prob(
        q.loc + 0.1
    )
    shifted = eqx.tree_at(lambda m: m.rate, model, jax.nn.softplus(q.loc + 0.1))
    np.testing.assert_allclose(q.log_prob(shifted), expected, rtol=1e-5)


def test_elbo_with_a_constrained_parameter_matches_hand_written_monte_carlo():
    """log p(data | θ) + log Gamma(θ) + log sigmoid(u) + H[q], θ = softplus(u)."""
    data = jnp.array([0.5, 1.0, 2.0, 0.7])
    model = Rate(jnp.array([1.5, 0.5]), jnp.array(0.0), jnp.array(2.0))
    q = ep.guide(model, init_scale=0.4)

    def loglik(m):
        return jnp.sum(distrax.Gamma(1.0, m.rate[0]).log_prob(data))  # Exponential

    ours = ep.elbo(q, loglik, jax.random.key(0), num_samples=100_000)
    u = q.loc + 0.4 * jax.random.normal(jax.random.key(5), (100_000, 2))
    theta = jax.nn.softplus(u)
    joint = (
        jnp.sum(distrax.Gamma(1.0, theta[:, :1]).log_prob(data), -1)
        + jnp.sum(distrax.Gamma(3.0, 2.0).log_prob(theta), -1)
        + jnp.sum(jax.nn.log_sigmoid(u), -1)
    )
    entropy = 2 * (0.5 * np.log(2 * np.pi * np.e) + np.log(0.4))
    se = np.std(joint) / np.sqrt(joint.size)
    assert abs(ours - (np.mean(joint) + entropy)) < 6 * se


def test_point_estimates_train_and_frozen_values_stay():
    data = jnp.array([0.5, 1.0, 2.0, 0.7])
    model = Rate(jnp.array([1.0, 1.0]), jnp.array(0.0), jnp.array(2.0))

    def loss(q, key):
        def loglik(m):
            return jnp.sum(distrax.Normal(m.offset, 1.0).log_prob(data))

        return -ep.elbo(q, loglik, key)

    q, _ = ep.fit(
        ep.guide(model),
        loss,
        optimiser=optax.adam(0.05),
        steps=400,
        key=jax.random.key(0),
        progress=False,
    )
    np.testing.assert_allclose(q.mean().offset, data.mean(), atol=0.02)
    assert q.mean().period == 2.0


@pytest.mark.slow
@pytest.mark.standard_promotion("numpyro SVI: numpyro/distributions/util.py:339")
def test_mean_field_elbo_matches_numpyro_autonormal():
    numpyro = pytest.importorskip("numpyro")
    dist = numpyro.distributions
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(60, 3)))
    y = jnp.asarray((x @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=60)) > 0, float)

    def np_model():
        w = numpyro.sample("w", dist.Normal(jnp.zeros(3), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=x @ w), obs=y)

    class Logistic(eqx.Module):
        w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))

    def loglik(m):
        return jnp.sum(distrax.Bernoulli(logits=x @ m.w).log_prob(y))

    # Same value at the same parameters (within Monte Carlo error)
    loc, scale = jnp.array([0.5, -1.0, 0.2]), jnp.array([0.3, 0.4, 0.5])
    q = ep.guide(Logistic(loc))
    q = eqx.tree_at(lambda g: g.scale, q, ep.positive(scale))
    ours = ep.elbo(q, loglik, jax.random.key(0), num_samples=50_000)
    auto = AutoNormal(np_model)
    params = {"w_auto_loc": loc, "w_auto_scale": scale}
    theirs = -np.asarray(
        Trace_ELBO(num_particles=50_000).loss(jax.random.key(1), params, np_model, auto)
    )
    np.testing.assert_allclose(ours, theirs, atol=0.05)

    # Same optimum (within Monte Carlo error)
    svi = SVI(
        np_model, AutoNormal(np_model, init_scale=0.1), optax.adam(0.02), Trace_ELBO(8)
    )
    result = svi.run(jax.random.key(2), 3000, progress_bar=False)
    np_loc = result.params["w_auto_loc"]
    np_scale = result.params["w_auto_scale"]

    def loss(q, key):
        return -ep.elbo(q, loglik, key, num_samples=8)

    q, _ = ep.fit(
        ep.guide(Logistic(jnp.zeros(3))),
        loss,
        optimiser=optax.adam(0.02),
        steps=3000,
        key=jax.random.key(3),
        progress=False,
    )
    np.testing.assert_allclose(q.loc, np_loc, atol=0.1)
    np.testing.assert_allclose(ep.resolve(q.scale), np_scale, atol=0.05)


def test_guides_jit_and_serialise(tmp_path):
    with jax.enable_x64(True):
        q = ep.guide(Regression(jnp.array([0.3, -0.5])), "low_rank")
        f = eqx.filter_jit(lambda g, k: ep.elbo(g, _loglik(X, Y), k))
        a = f(q, jax.random.key(0))
        b = ep.elbo(q, _loglik(X, Y), jax.random.key(0))
        np.testing.assert_allclose(a, b, rtol=1e-10)
        eqx.tree_serialise_leaves(tmp_path / "q.eqx", q)
        skeleton = ep.guide(Regression(jnp.zeros(2)), "low_rank")
        loaded = eqx.tree_deserialise_leaves(tmp_path / "q.eqx", skeleton)
        np.testing.assert_array_equal(loaded.loc, q.loc)


BAD = {
    "no prior": (
        lambda: ep.guide({"a": jnp.ones(2)}),
        ValueError,
        "no parameter of the model has a prior",
    ),
    "family": (
        lambda: ep.guide(Regression(jnp.zeros(2)), "diagonal"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "`family` must be",
    ),
    "scale": (
        lambda: ep.guide(Regression(jnp.zeros(2)), init_scale=0.0),
        ValueError,
        "`init_scale` must be > 0",
    ),
    "not a guide": (
        lambda: ep.elbo(Regression(jnp.zeros(2)), _loglik(X, Y), jax.random.key(0)),  # pyright: ignore[reportArgumentType]
        TypeError,
        "must come from `ep.guide`",
    ),
    "samples": (
        lambda: ep.elbo(
            ep.guide(Regression(jnp.zeros(2))),
            _loglik(X, Y),
            jax.random.key(0),
            num_samples=0,
        ),
        ValueError,
        "`num_samples` must be >= 1",
    ),  # fmt: skip
    "vector likelihood": (
        lambda: ep.elbo(
            ep.guide(Regression(jnp.zeros(2))),
            lambda m: distrax.Normal(jnp.ones((5, 2)) @ m.w, 1.0).log_prob(0.0),  # pyright: ignore[reportArgumentType]
            jax.random.key(0),
        ),
        TypeError,
        "must return a scalar",
    ),
    **{
        f"{kind} likelihood": (
            lambda value=value: ep.elbo(
                ep.guide(Regression(jnp.zeros(2))),
                lambda m: value(m),  # pyright: ignore[reportArgumentType]
                jax.random.key(0),
            ),
            TypeError,
            "must return a real scalar",
        )
        for kind, value in [
            ("None", lambda m: None),
            ("complex", lambda m: jax.lax.complex(jnp.sum(m.w), jnp.sum(m.w))),
            ("bool", lambda m: jnp.sum(m.w) > 0),
        ]
    },
}


@pytest.mark.parametrize("name", BAD, ids=list(BAD))
def test_bad_inputs(name):
    make, error, match = BAD[name]
    with jax.enable_x64(True), pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "prior",
    [distrax.Gamma(2.0, 1.0), distrax.Beta(2.0, 2.0), distrax.Uniform(0.0, 1.0)],
    ids=["Gamma", "Beta", "Uniform"],
)
def test_a_prior_narrower_than_an_unconstrained_field_is_refused(prior):
    """A field without a constraint whose prior is -inf on part of the real line
    is refused: the guide's samples would leave the support, and such draws give
    an ELBO of -inf with a zero gradient (the red team: accepted silently)."""

    class R(eqx.Module):
        x: jax.Array = ep.field(prior=prior)

    with pytest.raises(ValueError, match=r"`x` has no constraint.*prior's support"):
        ep.guide(R(jnp.array([0.3, 0.6])))


def test_real_line_priors_and_constrained_fields_give_finite_elbos():
    """The other side of the check: priors on the real line for unconstrained
    fields, and narrower ones for fields constrained to their support, build a
    guide whose ELBO is finite at every draw, even with wide draws."""

    class M(eqx.Module):
        a: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))
        b: jax.Array = ep.field(prior=distrax.Laplace(0.0, 1.0))
        c: jax.Array = ep.field(
            constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
        )
        d: jax.Array = ep.field(
            constraint=ep.constraints.unit_interval, prior=distrax.Beta(2.0, 2.0)
        )

    model = M(jnp.array(50.0), jnp.array(-3.0), jnp.array(0.5), jnp.array(0.5))
    q = ep.guide(model, init_scale=3.0)
    values = [ep.elbo(q, lambda m: jnp.zeros(()), jax.random.key(i)) for i in range(20)]
    assert np.all(np.isfinite(np.asarray(values)))


@pytest.mark.slow
def test_guide_checks_found_by_the_red_team():
    class B(eqx.Module):
        r: jax.Array = ep.field(prior=distrax.Gamma(2.0, 1.0))

    with pytest.raises(ValueError, match=r"`r` is outside the support of its prior"):
        ep.guide(B(-jnp.ones(2)))
    q = ep.guide(Rate(jnp.array([1.5, 0.5]), jnp.array(0.0), jnp.array(2.0)))
    draws = q.sample(jax.random.key(0), 5)
    with pytest.raises(ValueError, match=r"jax.vmap\(guide.log_prob\)"):
        q.log_prob(draws)
    assert jax.vmap(q.log_prob)(draws).shape == (5,)
    with pytest.raises(ValueError, match="`rank` must be a positive integer"):
        ep.guide(Regression(jnp.zeros(2)), "low_rank", rank=0)
    ep.guide(Regression(jnp.zeros(2)), init_scale=np.float32(0.2))  # pyright: ignore[reportArgumentType]  (NumPy scalars run too)
    value = ep.elbo(
        q,
        lambda m: jnp.sum(m.rate),
        jax.random.key(0),
        num_samples=np.int64(3),  # pyright: ignore[reportArgumentType]
    )
    assert np.isfinite(value)


@pytest.mark.parametrize(
    "value, kind",
    [(jnp.array(3), "dtype int32"), (3.0, "Python float"), (True, "Python bool")],
)
def test_a_prior_on_a_leaf_that_is_never_trained_names_it_and_the_fix(value, kind):
    """A prior on an integer array or a Python number: the guide would silently
    hold it fixed (it is not trained), so it says which and how to fix it."""

    class Model(eqx.Module):
        w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))
        n: Any = ep.field(prior=distrax.Normal(0.0, 1.0))

    with pytest.raises(TypeError, match=rf"`n` has a prior but is .*{kind}.*float"):
        ep.guide(Model(jnp.zeros(2), value))
    # Frozen on purpose, or a float array: accepted.
    assert ep.guide(Model(jnp.zeros(2), ep.frozen(jnp.array(1.0)))).loc.shape == (2,)
    assert ep.guide(Model(jnp.zeros(2), jnp.array(3.0))).loc.shape == (3,)
