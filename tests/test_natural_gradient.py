"""`ep.natural_gradient`: against exact posteriors, Titsias's collapsed bound and
GPJax 1.0's `fit_natgrads`, for every Gaussian family it updates; bad input."""

import distrax
import equinox as eqx
import gpjax as gpx
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as nd
import optax
import pytest
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _fit(model, loss, optimiser, steps=1):
    # (chunks of two steps: one program compiled for any number of steps)
    return ep.fit(
        model, loss, optimiser=optimiser, steps=steps, progress=False, chunk_size=2
    )


def _random_factor(key, d):
    a = jax.random.normal(key, (d, d))
    return jnp.tril(a, -1) + jnp.diag(0.5 + jnp.abs(jnp.diag(a)))


# ------------------------------------------------ conjugate SVGP: Titsias's bound


def _rbf(a, b):
    return 1.3 * jnp.exp(-0.5 * jnp.sum((a[:, None] - b[None]) ** 2, -1) / 0.7**2)


def _svgp_problem():
    x = jnp.linspace(-3.0, 3.0, 40)[:, None]
    y = jnp.sin(2.0 * x[:, 0]) + 0.2 * jax.random.normal(jax.random.key(0), (40,))
    z = jnp.linspace(-2.5, 2.5, 7)[:, None]
    return x, y, z, 0.3


def _svgp_elbo(m, lower, x, y, z, noise):
    """The uncollapsed ELBO of q(u) = N(m, L Lᵀ) over u = f(z), by hand."""
    kzz = _rbf(z, z) + 1e-6 * jnp.eye(z.shape[0])
    lz = jnp.linalg.cholesky(kzz)
    a = jax.scipy.linalg.solve_triangular(lz, _rbf(z, x), lower=True)
    b = jax.scipy.linalg.solve_triangular(lz.T, a, lower=False)  # K_zz⁻¹ K_zx
    mean = b.T @ m
    var = 1.3 - jnp.sum(a**2, 0) + jnp.sum((lower.T @ b) ** 2, 0)
    ell = jnp.sum(
        -0.5 * jnp.log(2 * jnp.pi * noise**2) - ((y - mean) ** 2 + var) / (2 * noise**2)
    )
    w = jax.scipy.linalg.solve_triangular(lz, lower, lower=True)
    maha = jnp.sum(jax.scipy.linalg.solve_triangular(lz, m, lower=True) ** 2)
    log_dets = 2 * jnp.sum(jnp.log(jnp.diag(lz))) - 2 * jnp.sum(
        jnp.log(jnp.diag(lower))
    )
    kl = 0.5 * (jnp.sum(w**2) + maha - z.shape[0] + log_dets)
    return ell - kl


def _titsias(x, y, z, noise):
    """The collapsed bound log N(y | 0, Q + σ²I) - tr(K - Q) / (2σ²), by hand."""
    kzz = _rbf(z, z) + 1e-6 * jnp.eye(z.shape[0])
    a = jax.scipy.linalg.solve_triangular(
        jnp.linalg.cholesky(kzz), _rbf(z, x), lower=True
    )
    q = a.T @ a
    cov = q + noise**2 * jnp.eye(x.shape[0])
    fit = jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros_like(y), cov)
    return fit - (1.3 * x.shape[0] - jnp.trace(q)) / (2 * noise**2)


def test_one_step_of_rate_one_reaches_titsias_bound_from_any_start():
    x, y, z, noise = _svgp_problem()
    starts = {}
    for seed in (1, 2):  # (two starts in one model: one program compiled)
        k1, k2 = jax.random.split(jax.random.key(seed))
        q = ep.FixedDistrax(
            distrax.MultivariateNormalTri, 2.0 * jax.random.normal(k1, (7,)), jnp.eye(7)
        )
        lower = ep.lower_cholesky(_random_factor(k2, 7))
        starts[seed] = eqx.tree_at(lambda q: q.scale_tri, q, lower)

    def elbos(model):
        model = ep.resolve(model)
        return [_svgp_elbo(q.loc, q.scale_tri, x, y, z, noise) for q in model.values()]

    natural = ep.natural_gradient(1.0, where=lambda m: (m[1], m[2]))
    trained, _ = _fit(starts, lambda m: -sum(elbos(m)), natural)
    bound = float(_titsias(x, y, z, noise))
    assert all(float(e) < bound - 1.0 for e in elbos(starts))  # (far from it)
    for elbo in elbos(trained):
        assert abs(float(elbo) - bound) < 1e-8


# ------------------------------------- Bayesian linear regression: exact posteriors


class _Line(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, 2.0))


def _regression():
    x = jax.random.normal(jax.random.key(3), (30, 3))
    y = x @ jnp.array([1.0, -2.0, 0.5]) + 0.3 * jax.random.normal(
        jax.random.key(4), (30,)
    )
    return x, y, 0.3, 2.0


def _regression_loss(m, cov, x, y, noise, tau):
    """The negative ELBO of q(w) = N(m, cov), exactly (no sampling)."""
    ell = -(jnp.sum((y - x @ m) ** 2) + jnp.trace(x @ cov @ x.T)) / (2 * noise**2)
    d = m.shape[0]
    kl = 0.5 * (
        (jnp.sum(m**2) + jnp.trace(cov)) / tau**2
        - d
        - jnp.linalg.slogdet(cov)[1]
        + d * jnp.log(tau**2)
    )
    return -(ell - kl)


def test_full_rank_guide_reaches_the_exact_posterior_in_one_step():
    x, y, noise, tau = _regression()
    q = ep.guide(_Line(jnp.zeros(3)), "full_rank", init_scale=0.7)

    def loss(q):
        lower = ep.resolve(q.scale)
        return _regression_loss(q.loc, lower @ lower.T, x, y, noise, tau)

    q, _ = _fit(q, loss, ep.natural_gradient(1.0))
    cov = jnp.linalg.inv(x.T @ x / noise**2 + jnp.eye(3) / tau**2)
    mean = cov @ x.T @ y / noise**2
    lower = ep.resolve(q.scale)
    np.testing.assert_allclose(q.loc, mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(lower @ lower.T, cov, rtol=0, atol=1e-12)
    np.testing.assert_allclose(q.mean().w, mean, rtol=0, atol=1e-10)


class _Means(eqx.Module):
    mu: jax.Array = ep.field(prior=distrax.Normal(0.0, 2.0))


def test_mean_field_guide_of_independent_normals_is_exact_in_one_step():
    # y[j, k] ~ N(μ_j, σ²), μ_j ~ N(0, τ²): the posterior factorises.
    y = jax.random.normal(jax.random.key(5), (4, 6)) + jnp.arange(4.0)[:, None]
    noise, tau = 0.5, 2.0
    q = ep.guide(_Means(jnp.zeros(4)), "mean_field")

    def loss(q):
        m, s = q.loc, ep.resolve(q.scale)
        ell = -jnp.sum((y - m[:, None]) ** 2 + s[:, None] ** 2) / (2 * noise**2)
        kl = jnp.sum((m**2 + s**2) / (2 * tau**2) - jnp.log(s / tau) - 0.5)
        return -(ell - kl)

    q, _ = _fit(q, loss, ep.natural_gradient(1.0))
    precision = 6 / noise**2 + 1 / tau**2
    np.testing.assert_allclose(q.loc, y.sum(1) / noise**2 / precision, atol=1e-12)
    np.testing.assert_allclose(ep.resolve(q.scale), precision**-0.5, atol=1e-12)


# ------------------------------------------------------ GPJax 1.0's fit_natgrads


@pytest.mark.slow
@pytest.mark.standard_promotion("gpjax 1.0's objectives mix int and float arrays")
def test_same_iterates_as_gpjax_fit_natgrads():
    key = jax.random.key(6)
    x = jnp.sort(jax.random.uniform(key, (60, 1), minval=-3.0, maxval=3.0), 0)
    labels = (jnp.sin(2.0 * x) > 0).astype(x.dtype)
    data = gpx.Dataset(X=x, y=labels)
    z = jnp.linspace(-2.5, 2.5, 6)[:, None]
    prior = gpx.gps.Prior(
        mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF()
    )
    posterior = prior * gpx.likelihoods.Bernoulli()  # pyright: ignore[reportCallIssue]
    k1, k2 = jax.random.split(jax.random.key(7))
    m0, l0 = 0.5 * jax.random.normal(k1, (6,)), _random_factor(k2, 6)
    family = gpx.variational_families.VariationalGaussian(
        model=posterior,
        inducing_inputs=z,
        variational_mean=m0[:, None],
        variational_root_covariance=l0,
    )
    objective = lambda q, d: -gpx.objectives.elbo(q, d)  # noqa: E731
    rate = optax.linear_schedule(0.3, 0.9, 20)
    theirs, history = gpx.fit_natgrads(
        model=family, objective=objective, train_data=data,
        optim=optax.adam(0.05), natgrad_lr=rate, num_iters=20, verbose=False,
    )  # fmt: skip

    # The same GPJax model (its hyperparameters as they are, paramax wrappers),
    # its variational coordinates taken from a wrapped MultivariateNormalTri.
    coordinates = lambda f: (f.variational_mean, f.variational_root_covariance)  # noqa: E731
    q = ep.FixedDistrax(distrax.MultivariateNormalTri, m0, l0)
    q = eqx.tree_at(lambda q: q.scale_tri, q, ep.lower_cholesky(l0))
    model = {"gp": eqx.tree_at(coordinates, family, (None, None)), "q": q}

    def loss(model):
        q = ep.resolve(model["q"])
        gp = eqx.tree_at(
            coordinates, model["gp"], (q.loc[:, None], q.scale_tri),
            is_leaf=lambda x: x is None,
        )  # fmt: skip
        return objective(gp, data)

    ours, losses = _fit(model, loss, ep.natural_gradient(rate, optax.adam(0.05)), 20)
    np.testing.assert_allclose(losses, history, rtol=1e-10)
    q = ep.resolve(ours["q"])
    np.testing.assert_allclose(
        q.loc, theirs.variational_mean.unwrap()[:, 0], rtol=1e-9, atol=1e-10
    )
    lower = theirs.variational_root_covariance.unwrap()
    np.testing.assert_allclose(q.scale_tri, lower, rtol=1e-9, atol=1e-10)
    gp, kernel = ours["gp"], theirs.model.prior.kernel
    np.testing.assert_allclose(
        gp.inducing_inputs.unwrap(),
        theirs.inducing_inputs.unwrap(),
        rtol=1e-6,
        atol=1e-6,
    )
    for name in ("lengthscale", "variance"):
        ours_value = getattr(gp.model.prior.kernel, name).unwrap()
        np.testing.assert_allclose(
            ours_value, getattr(kernel, name).unwrap(), rtol=1e-9, atol=1e-10
        )
    # (and they moved: the comparison is not of two starts)
    assert float(jnp.max(jnp.abs(q.loc - m0))) > 0.1
    assert float(jnp.abs(gp.model.prior.kernel.lengthscale.unwrap() - 1.0)) > 0.01


# -------------------------------------------------------------------- every family


def _triangular(cls, argument, m, lower, **static):
    d = ep.FixedDistrax(cls, m, **{argument: lower}, **static)
    return eqx.tree_at(lambda d: getattr(d, argument), d, ep.lower_cholesky(lower))


def _diagonal(cls, argument, m, s):
    return ep.FixedDistrax(cls, m, **{argument: ep.positive(s)})


TRI = {  # name: (wrapper, the name of its Cholesky factor)
    "distrax.MultivariateNormalTri": (distrax.MultivariateNormalTri, "scale_tri"),
    "tfd.MultivariateNormalTriL": (tfd.MultivariateNormalTriL, "scale_tril"),
    "numpyro.MultivariateNormal": (nd.MultivariateNormal, "scale_tril"),
}
DIAG = {
    "distrax.MultivariateNormalDiag": (distrax.MultivariateNormalDiag, "scale_diag"),
    "tfd.MultivariateNormalDiag": (tfd.MultivariateNormalDiag, "scale_diag"),
    "distrax.Normal": (distrax.Normal, "scale"),
    "tfd.Normal": (tfd.Normal, "scale"),
    "numpyro.Normal": (nd.Normal, "scale"),
}


@pytest.mark.standard_promotion("numpyro's MultivariateNormal promotes int shapes")
def test_every_family_steps_as_distrax():
    """One model holding every family's Gaussian (and a plain-array factor): each
    has the same loss of its own (m, scale), so each must end where distrax's
    does; three steps of rate 0.6, each Gaussian on its own."""
    x, y, noise, tau = _regression()
    m0 = jnp.array([0.3, -0.2, 0.1])
    l0 = _random_factor(jax.random.key(8), 3)
    s0 = jnp.array([0.5, 1.5, 0.8])
    model = {n: _triangular(c, a, m0, l0) for n, (c, a) in TRI.items()}
    model |= {n: _diagonal(c, a, m0, s0) for n, (c, a) in DIAG.items()}
    plain = ep.FixedDistrax(distrax.MultivariateNormalTri, m0, l0)
    model["plain factor"] = plain

    def loss(model):
        model = ep.resolve(model)
        total = jnp.zeros(())
        for name, q in model.items():
            argument = {**TRI, **DIAG}.get(name, (None, "scale_tri"))[1]
            scale = getattr(q, argument)
            cov = scale @ scale.T if name in TRI or name == "plain factor" else (
                jnp.diag(scale**2)
            )  # fmt: skip
            total = total + _regression_loss(q.loc, cov, x, y, noise, tau)
        return total

    names = list(model)
    every = ep.natural_gradient(0.6, where=lambda m: [m[k] for k in names])
    trained, _ = _fit(model, loss, every, 3)
    trained = ep.resolve(trained)
    tri = trained["distrax.MultivariateNormalTri"]
    diag = trained["distrax.MultivariateNormalDiag"]
    assert float(jnp.max(jnp.abs(tri.loc - m0))) > 0.1  # (it moved)
    for name in [*TRI, "plain factor"]:
        factor = getattr(trained[name], TRI.get(name, (None, "scale_tri"))[1])
        np.testing.assert_allclose(trained[name].loc, tri.loc, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(factor, tri.scale_tri, rtol=1e-12, atol=1e-14)
    for name, (_, argument) in DIAG.items():
        np.testing.assert_allclose(trained[name].loc, diag.loc, rtol=1e-12)
        np.testing.assert_allclose(
            getattr(trained[name], argument), diag.scale_diag, rtol=1e-12
        )


def test_where_selects_the_gaussians_and_optimiser_trains_the_rest():
    x, y, noise, tau = _regression()
    m0 = jnp.zeros(3)
    model = {
        "q": _triangular(distrax.MultivariateNormalTri, "scale_tri", m0, jnp.eye(3)),
        "other": _triangular(
            distrax.MultivariateNormalTri, "scale_tri", m0, jnp.eye(3)
        ),
        "shift": jnp.array(0.5),
    }

    def loss(model):
        model = ep.resolve(model)
        total = (model["shift"] - 2.0) ** 2
        for q in (model["q"], model["other"]):
            cov = q.scale_tri @ q.scale_tri.T
            total = total + _regression_loss(q.loc, cov, x, y, noise, tau)
        return total

    opt = ep.natural_gradient(1.0, optax.sgd(0.25), where=lambda m: m["q"])
    trained, _ = _fit(model, loss, opt)
    cov = jnp.linalg.inv(x.T @ x / noise**2 + jnp.eye(3) / tau**2)
    trained = ep.resolve(trained)
    np.testing.assert_allclose(trained["q"].loc, cov @ x.T @ y / noise**2, atol=1e-10)
    # `other` took one step of sgd (the gradient at the start, as `q` does not
    # enter its loss term), `shift` too: 0.5 - 0.25 · 2 (0.5 - 2).
    assert jnp.allclose(trained["shift"], 1.25)
    grad = jax.grad(lambda m: _regression_loss(m, jnp.eye(3), x, y, noise, tau))(m0)
    np.testing.assert_allclose(trained["other"].loc, m0 - 0.25 * grad, atol=1e-12)


def test_without_optimiser_it_composes_with_multi_transform():
    x, y, noise, tau = _regression()
    q = _triangular(
        distrax.MultivariateNormalTri, "scale_tri", jnp.zeros(3), jnp.eye(3)
    )
    model = {"q": q, "shift": jnp.array(0.5)}

    def loss(model):
        model = ep.resolve(model)
        q = model["q"]
        cov = q.scale_tri @ q.scale_tri.T
        shift = (model["shift"] - 2.0) ** 2
        return shift + _regression_loss(q.loc, cov, x, y, noise, tau)

    def labels(params):
        group = lambda path, _: "natural" if path[0].key == "q" else "sgd"  # noqa: E731
        return jax.tree_util.tree_map_with_path(group, params)

    transforms: dict = {"natural": ep.natural_gradient(1.0), "sgd": optax.sgd(0.25)}
    trained, _ = _fit(model, loss, optax.multi_transform(transforms, labels), 2)
    trained = ep.resolve(trained)
    cov = jnp.linalg.inv(x.T @ x / noise**2 + jnp.eye(3) / tau**2)
    np.testing.assert_allclose(trained["q"].loc, cov @ x.T @ y / noise**2, atol=1e-10)
    assert jnp.allclose(trained["shift"], 1.625)  # two steps of sgd


# ------------------------------------------------------------------------ bad input


def _normal_model():
    q = ep.FixedDistrax(distrax.Normal, jnp.zeros(2), ep.positive(jnp.ones(2)))
    return {"q": q, "kernel": {"lengthscale": ep.positive(1.0)}}


def _normal_loss(model):
    model = ep.resolve(model)
    q = model["q"]
    return (
        jnp.sum(q.loc**2 + q.scale**2 - jnp.log(q.scale))
        + model["kernel"]["lengthscale"] ** 2
    )


def test_selecting_a_leaf_that_is_no_gaussian_names_it():
    opt = ep.natural_gradient(0.5, optax.adam(0.1), where=lambda m: m["kernel"])
    with pytest.raises(TypeError, match=r"`\['kernel'\]`, a dict, which is not a Gaus"):
        _fit(_normal_model(), _normal_loss, opt)
    model = _normal_model()
    model["y"] = ep.FixedDistrax(distrax.Bernoulli, logits=jnp.zeros(2))
    opt = ep.natural_gradient(0.5, where=lambda m: (m["q"], m["y"]))
    with pytest.raises(TypeError, match=r"`\['y'\]`, a wrapped Bernoulli"):
        _fit(model, _normal_loss, opt)


def test_a_model_without_gaussians_is_refused():
    with pytest.raises(ValueError, match=r"holds 0 trained Gaussians .* `where="):
        _fit(
            {"x": jnp.ones(2)}, lambda m: jnp.sum(m["x"] ** 2), ep.natural_gradient(1.0)
        )


def test_a_low_rank_guide_is_refused_saying_why():
    q = ep.guide(_Line(jnp.zeros(3)), "low_rank")
    loss = lambda q: jnp.sum(q.loc**2)  # noqa: E731
    with pytest.raises(ValueError, match="not closed under.*full_rank"):
        _fit(q, loss, ep.natural_gradient(1.0))


@pytest.mark.parametrize("rate", [1.5, 0.0, -0.1])
def test_a_learning_rate_outside_zero_one_is_refused(rate):
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\]"):
        ep.natural_gradient(rate)


def test_a_learning_rate_that_is_no_number_is_refused():
    with pytest.raises(TypeError, match="a number or an optax schedule"):
        ep.natural_gradient(True)


def test_a_schedule_leaving_zero_one_stops_the_fit_at_that_step():
    """A schedule is checked as it runs (optax's are not all vectorised): at the
    first step whose rate is outside [0, 1] the fit stops, with the model before
    it; a rate of 0 is a step that changes nothing."""

    def schedule(n):  # 0.5, 0.5, 0, 1.2, ...
        return jnp.where(n == 2, 0.0, jnp.where(n >= 3, 1.2, 0.5))

    with pytest.raises(ep.NonFiniteLossError, match=r"step 3") as caught:
        _fit(_normal_model(), _normal_loss, ep.natural_gradient(schedule), steps=6)
    two, _ = _fit(_normal_model(), _normal_loss, ep.natural_gradient(0.5), steps=2)
    got, want = ep.resolve(caught.value.model["q"]), ep.resolve(two["q"])
    np.testing.assert_allclose(got.loc, want.loc, atol=1e-12)
    np.testing.assert_allclose(got.scale, want.scale, rtol=1e-12)


def test_a_schedule_of_no_scalar_is_named():
    with pytest.raises(TypeError, match="schedule must return a scalar"):
        _fit(_normal_model(), _normal_loss, ep.natural_gradient(lambda n: jnp.ones(2)))


def test_numbers_of_any_kind_and_injected_hyperparameters_are_taken():
    """NumPy and JAX scalars as the learning rate and backoff, and
    `optax.inject_hyperparams` (which makes them arrays), step as floats do."""
    want, _ = _fit(_normal_model(), _normal_loss, ep.natural_gradient(0.5), steps=2)
    for opt in (
        ep.natural_gradient(
            np.float32(0.5), backoff=np.float64(0.5), max_backoff=np.int64(5)
        ),
        ep.natural_gradient(jnp.array(0.5)),
        optax.inject_hyperparams(ep.natural_gradient, static_args=("max_backoff",))(
            learning_rate=0.5
        ),
    ):
        got, _ = _fit(_normal_model(), _normal_loss, opt, steps=2)
        assert eqx.tree_equal(got, want, rtol=1e-12, atol=1e-12)


def test_where_none_takes_the_one_trained_gaussian_and_refuses_several():
    """A frozen Gaussian (a prior) is no candidate; a Gaussian likelihood next to
    q is one more, so `where=` must say which is variational."""
    model = _normal_model()
    model["prior"] = ep.frozen(ep.FixedDistrax(distrax.Normal, 0.0, 1.0))
    alone, _ = _fit(_normal_model(), _normal_loss, ep.natural_gradient(0.5), steps=2)
    got, _ = _fit(model, _normal_loss, ep.natural_gradient(0.5), steps=2)
    assert eqx.tree_equal(got["q"], alone["q"])
    model["likelihood"] = ep.FixedDistrax(distrax.Normal, jnp.zeros(2), jnp.ones(2))
    with pytest.raises(ValueError, match=r"2 trained Gaussians .*`\['likelihood'\]`"):
        _fit(model, _normal_loss, ep.natural_gradient(0.5))
    chosen = ep.natural_gradient(0.5, where=lambda m: m["q"])
    got, _ = _fit(model, _normal_loss, chosen, steps=2)
    assert eqx.tree_equal(got["q"], alone["q"])
    assert eqx.tree_equal(got["likelihood"], model["likelihood"])


@pytest.mark.parametrize(
    "wrap",
    [
        lambda ng: optax.chain(optax.clip_by_global_norm(0.1), ng),
        lambda ng: optax.MultiSteps(ng, every_k_schedule=2),
    ],
    ids=["after a clip", "in MultiSteps"],
)
def test_an_optimiser_that_would_not_see_the_gradient_is_refused(wrap):
    """With an optimiser the rest's gradient is taken again at the updated
    Gaussians: after other transformations or inside MultiSteps that would drop
    theirs (the red team: silently), so it is an error."""
    opt = wrap(ep.natural_gradient(0.5, optax.sgd(0.1)))
    with pytest.raises(TypeError, match="must get the loss's gradient itself"):
        _fit(_normal_model(), _normal_loss, opt, steps=2)


@pytest.mark.slow
@pytest.mark.standard_promotion("optax's zoom line search mixes int32, int64")
def test_an_inner_optimiser_that_needs_the_loss_gets_it():
    """`optax.lbfgs` for the rest gets `value=`, `grad=`, `value_fn=` of the
    rest at the updated Gaussians; the loss separates, so its iterates are a
    hand-written lbfgs loop's on the rest's term alone."""
    trained, _ = _fit(
        _normal_model(), _normal_loss, ep.natural_gradient(1.0, optax.lbfgs()), steps=4
    )
    rest = lambda raw: jax.nn.softplus(raw) ** 2  # (ep.positive: softplus)
    raw, opt = _normal_model()["kernel"]["lengthscale"].param, optax.lbfgs()
    state = opt.init(raw)
    for _ in range(4):
        value, grad = jax.value_and_grad(rest)(raw)
        updates, state = opt.update(
            grad, state, raw, value=value, grad=grad, value_fn=rest
        )
        raw = optax.apply_updates(raw, updates)
    got = trained["kernel"]["lengthscale"].param
    np.testing.assert_allclose(got, np.asarray(raw), rtol=1e-10)
    assert not np.allclose(got, _normal_model()["kernel"]["lengthscale"].param)


def test_a_factor_reads_as_its_lower_triangle():
    """distrax and TFP read only a factor's lower triangle: two plain factors
    that differ above the diagonal are one Gaussian and take one step (the red
    team: the step read the upper part)."""
    lower = jnp.array([[1.0, 0.0], [0.3, 1.0]])
    results = []
    for factor in (lower, lower.at[0, 1].set(0.7)):
        q = ep.FixedDistrax(distrax.MultivariateNormalTri, jnp.zeros(2), factor)

        def loss(q):  # the optimum N(0.5, 0.5 I): one step of rate 1
            d = q.instantiate()
            m, cov = d.mean(), d.covariance()
            ell = 0.5 * (jnp.sum((m - 1) ** 2) + jnp.trace(cov))
            return ell + 0.5 * (
                jnp.sum(m**2) + jnp.trace(cov) - jnp.linalg.slogdet(cov)[1]
            )

        trained, _ = _fit(q, loss, ep.natural_gradient(1.0))
        results.append(trained.instantiate())
    for d in results:
        np.testing.assert_allclose(d.mean(), [0.5, 0.5], atol=1e-12)
        np.testing.assert_allclose(d.covariance(), 0.5 * jnp.eye(2), atol=1e-12)


def test_a_step_out_of_the_cone_stops_the_fit_naming_the_gaussian():
    def loss(model):  # (rewards variance: no backed-off step stays positive definite)
        model = ep.resolve(model)
        q = model["q"]
        shift = model["kernel"]["lengthscale"]
        return jnp.sum(q.loc**2) - 100.0 * jnp.sum(q.scale**2) + shift**2

    opt = ep.natural_gradient(1.0, optax.adam(0.1))
    with pytest.raises(ep.NonFiniteLossError, match="not finite at step 0") as info:
        _fit(_normal_model(), loss, opt, steps=2)
    message = str(info.value)
    assert "leaves `['q'].loc`, `['q'].scale.param` not finite" in message
    assert "lengthscale" not in message  # (the rest stepped at the old q: finite)
    assert eqx.tree_equal(info.value.model, _normal_model())


def test_a_frozen_scale_is_named():
    model = _normal_model()
    model["q"] = ep.FixedDistrax(
        distrax.Normal, jnp.zeros(2), ep.frozen(ep.positive(jnp.ones(2)))
    )
    with pytest.raises(
        ValueError, match=r"`\['q'\].scale` of the Gaussian `\['q'\]` is frozen"
    ):
        _fit(model, _normal_loss, ep.natural_gradient(1.0))


@pytest.mark.standard_promotion("numpyro's MultivariateNormal promotes int shapes")
def test_numpyro_multivariate_normal_by_covariance_is_refused():
    q = ep.FixedDistrax(nd.MultivariateNormal, jnp.zeros(2), jnp.eye(2))
    loss = lambda q: jnp.sum(q.loc**2) + jnp.sum(q.covariance_matrix**2)  # noqa: E731
    with pytest.raises(ValueError, match="`covariance_matrix` given.*scale_tril"):
        _fit({"q": q}, loss, ep.natural_gradient(1.0))
