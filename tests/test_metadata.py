"""The parameter-metadata registry, against hand-written references."""

from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfb = tfp.bijectors
C = ep.constraints


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol, atol)


def _inv_softplus(y):
    return jnp.log(jnp.expm1(y))


def _logit(p):
    return jnp.log(p) - jnp.log1p(-p)


GAMMA = ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0))


class RBF(eqx.Module):
    lengthscale: jax.Array = ep.field(constraint=C.positive, prior=GAMMA)
    variance: jax.Array = ep.field(bijector=ep.FixedDistrax(tfb.Exp))


class Periodic(eqx.Module):
    period: jax.Array = ep.field(trainable=False)
    lengthscale: jax.Array = ep.field(constraint=C.interval(0.1, 10.0))


class GP(eqx.Module):
    kernels: list
    noise: jax.Array = ep.field(
        constraint=C.positive, prior=distrax.LogStddevNormal(0.0, 0.0)
    )
    weights: jax.Array = ep.field(constraint=C.simplex)
    chol: jax.Array = ep.field(constraint=C.lower_cholesky)
    mean: jax.Array  # pyright: ignore[reportGeneralTypeIssues]
    jitter: float = eqx.field(static=True, default=1e-6)


def _model():
    return GP(
        kernels=[
            RBF(jnp.array([0.5, 2.0]), jnp.array(1.5)),
            Periodic(jnp.array(3.0), jnp.array(0.7)),
        ],
        noise=jnp.array(0.1),
        weights=jnp.array([0.2, 0.3, 0.5]),
        chol=jnp.array([[1.0, 0.0], [0.4, 2.0]]),
        mean=jnp.array(0.3),
    )


IS_SPEC = lambda x: x is None or isinstance(x, ep.ParamSpec)  # noqa: E731


def test_spec_tree_mirrors_the_model_and_reads_nested_metadata():
    model = _model()
    specs = ep.spec_tree(model)
    assert jtu.tree_structure(specs, is_leaf=IS_SPEC) == jtu.tree_structure(model)
    assert specs.kernels[0].lengthscale.constraint is C.positive
    assert specs.kernels[0].lengthscale.prior is GAMMA
    assert specs.kernels[1].period.trainable is False
    assert specs.noise.constraint is C.positive
    assert specs.mean is None


def test_bijector_and_prior_trees_mirror_the_model():
    model = _model()
    bijectors = ep.bijector_tree(model)
    is_bij = lambda x: hasattr(x, "forward")  # noqa: E731
    assert jtu.tree_structure(bijectors, is_leaf=is_bij) == jtu.tree_structure(model)
    u = jnp.array([-3.0, 0.0, 4.0])
    _close(bijectors.noise.forward(u), jax.nn.softplus(u))
    _close(bijectors.kernels[0].variance.forward(u), jnp.exp(u))
    _close(bijectors.mean.forward(u), u)  # identity where unannotated
    priors = ep.prior_tree(model)
    assert priors.kernels[0].lengthscale is GAMMA
    assert priors.mean is None and priors.kernels[1].period is None


class _Held(eqx.Module):
    p: jax.Array = ep.field(constraint=C.unit_interval, bijector=distrax.Sigmoid())
    q: jax.Array = ep.field(constraint=C.positive, bijector=jax.nn.softplus)


def test_a_bijector_tree_entry_answers_as_the_transform_it_holds():
    # Raw distrax bijectors without arrays and plain callables are held as static
    # values; their entries still answer `forward`, `inverse` and the log-det as
    # the raw objects do, and print as them.
    trees = ep.bijector_tree(_Held(jnp.array(0.3), jnp.array(2.0)))
    x, raw = jnp.array([-2.0, 0.5, 3.0]), distrax.Sigmoid()
    _close(trees.p.forward(x), raw.forward(x))
    _close(trees.p.inverse(raw.forward(x)), raw.inverse(raw.forward(x)))
    _close(trees.p.forward_log_det_jacobian(x), raw.forward_log_det_jacobian(x))
    _close(trees.q.forward(x), jax.nn.softplus(x))
    assert not hasattr(trees.q, "inverse")  # a plain callable is forward only
    assert eqx.tree_pformat(trees) == "_Held(p=distrax.Sigmoid(), q=softplus)"


def test_unconstrain_matches_hand_written_inverses_and_constrain_inverts_it():
    model = _model()
    raw = ep.unconstrain(model)
    _close(raw.kernels[0].lengthscale, _inv_softplus(model.kernels[0].lengthscale))
    _close(raw.kernels[0].variance, jnp.log(1.5))
    _close(raw.kernels[1].lengthscale, _logit((0.7 - 0.1) / 9.9), rtol=1e-4)
    _close(raw.noise, _inv_softplus(0.1))
    assert raw.mean is model.mean and raw.kernels[1].period is model.kernels[1].period
    back = ep.constrain(raw)
    for a, b in zip(jtu.tree_leaves(back), jtu.tree_leaves(model)):
        _close(a, b, rtol=1e-5, atol=1e-6)


def test_parameterize_resolves_back_and_excludes_frozen_from_trainable():
    model = _model()
    params = ep.parameterize(model)
    assert ep.is_bijector(params.noise)
    assert isinstance(params.kernels[1].period, ep.Frozen)
    resolved = ep.resolve(params)
    for a, b in zip(jtu.tree_leaves(resolved), jtu.tree_leaves(model)):
        _close(a, b, rtol=1e-5, atol=1e-6)
    spec = ep.trainable(params)
    values, _ = eqx.partition(params, spec)
    trained = {id(x) for x in jtu.tree_leaves(values)}
    assert id(params.kernels[1].period.value) not in trained
    assert id(params.noise.param) in trained
    assert id(params.mean) in trained


def test_log_prior_equals_hand_summed_log_probs():
    model = _model()
    expected = jnp.sum(
        distrax.Gamma(2.0, 1.0).log_prob(model.kernels[0].lengthscale)
    ) + distrax.Normal(0.0, 1.0).log_prob(model.noise)
    _close(ep.log_prior(model), expected)


def test_unconstrained_density_is_log_prior_plus_log_det_jacobian():
    class K(eqx.Module):
        lengthscale: jax.Array = ep.field(constraint=C.positive, prior=GAMMA)

    params = ep.parameterize(K(jnp.array(1.5)))
    u = params.lengthscale.param
    got = ep.log_prior(ep.resolve(params)) + ep.log_det_jacobian(params)
    # Change of variables: log p_u(u) = log p(softplus(u)) + log softplus'(u).
    expected = distrax.Gamma(2.0, 1.0).log_prob(jax.nn.softplus(u)) + jnp.log(
        jax.nn.sigmoid(u)
    )
    _close(got, expected)


def test_overrides_on_a_module_you_do_not_own_win_over_metadata():
    linear = eqx.nn.Linear(3, 2, key=jax.random.PRNGKey(0))
    linear = eqx.tree_at(lambda lin: lin.bias, linear, jnp.array([0.5, 1.5]))
    overrides = ep.WhereDict(
        {
            lambda lin: lin.bias: ep.ParamSpec(constraint=C.positive),
            "weight": ep.ParamSpec(trainable=False),
        }
    )
    raw = ep.unconstrain(linear, overrides)
    _close(raw.bias, _inv_softplus(linear.bias))
    assert raw.weight is linear.weight
    params = ep.parameterize(linear, overrides)
    assert isinstance(params.weight, ep.Frozen) and ep.is_bijector(params.bias)
    # An override merges over field metadata, attribute by attribute: what it
    # sets wins, the rest (here the constraint and the prior) is kept.
    model = _model()
    specs = ep.spec_tree(model, {lambda m: m.noise: ep.ParamSpec(trainable=False)})
    assert specs.noise.constraint is C.positive and specs.noise.trainable is False
    assert specs.noise.prior is not None


def test_override_selecting_nothing_names_its_label():
    linear = eqx.nn.Linear(3, 2, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="kernel.lengthscale"):
        ep.spec_tree(linear, {lambda m: m.kernel.lengthscale: ep.ParamSpec()})


def test_value_outside_support_names_the_parameter_path():
    model = eqx.tree_at(
        lambda m: m.kernels[0].lengthscale, _model(), jnp.array([1.0, -2.0])
    )
    with pytest.raises(
        ValueError, match=r"`kernels\[0\]\.lengthscale`.*constraints.positive"
    ):
        ep.unconstrain(model)
    with pytest.raises(ValueError, match=r"`kernels\[0\]\.lengthscale`"):
        ep.parameterize(model)
    bad_weights = eqx.tree_at(lambda m: m.weights, _model(), jnp.array([0.5, 0.6, 0.1]))
    with pytest.raises(ValueError, match=r"`weights`.*constraints.simplex"):
        ep.unconstrain(bad_weights)
    bad_chol = eqx.tree_at(
        lambda m: m.chol, _model(), jnp.array([[1.0, 0.3], [0.4, 2.0]])
    )
    with pytest.raises(ValueError, match=r"`chol`.*constraints.lower_cholesky"):
        ep.unconstrain(bad_chol)


def test_unknown_constraint_points_at_register_bijector_and_registration_works():
    class Negative(C.Constraint):
        def check(self, value):
            return value < 0

    with pytest.raises(TypeError, match=r"register_bijector\(Negative\)"):
        ep.default_bijector(Negative())

    @ep.register_bijector(Negative)
    def _(constraint):
        return ep.FixedDistrax(
            tfb.Chain,
            [ep.FixedDistrax(tfb.Scale, jnp.array(-1.0)), ep.FixedDistrax(tfb.Exp)],
        )

    class M(eqx.Module):
        x: jax.Array = ep.field(constraint=Negative())

    raw = ep.unconstrain(M(jnp.array(-2.0)))
    _close(raw.x, jnp.log(2.0))
    _close(ep.constrain(raw).x, -2.0)
    with pytest.raises(ValueError, match="`x`"):
        ep.unconstrain(M(jnp.array(2.0)))


def test_bad_specs_are_rejected():
    with pytest.raises(TypeError, match="`constraint` must be"):
        ep.ParamSpec(constraint="positive")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`trainable` must be"):
        ep.ParamSpec(trainable=1)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`low` must be smaller"):
        C.interval(2.0, 1.0)
    with pytest.raises(TypeError, match="register_bijector takes"):
        ep.register_bijector(int)


def test_a_jitted_step_on_unconstrained_weak_values_compiles_once():
    class Noise(eqx.Module):
        scale: jax.Array = ep.field(constraint=C.positive)

    raw = ep.unconstrain(Noise(jnp.array(1.3)))  # a weakly typed input
    assert not raw.scale.weak_type
    traces = []

    @eqx.filter_jit
    def step(raw):
        traces.append(None)
        grads = eqx.filter_grad(lambda r: ep.constrain(r).scale ** 2)(raw)
        return jtu.tree_map(lambda p, g: p - 0.1 * g, raw, grads)

    for _ in range(3):
        raw = step(raw)
    assert len(traces) == 1


def test_prior_without_log_prob_is_an_error_when_declared():
    with pytest.raises(TypeError, match=r"the prior 0.5 has no `log_prob`"):

        class M(eqx.Module):
            x: jax.Array = ep.field(prior=0.5)


def test_training_through_constrain_matches_hand_written_gradients():
    class Noise(eqx.Module):
        scale: jax.Array = ep.field(constraint=C.positive)
        shift: jax.Array  # pyright: ignore[reportGeneralTypeIssues]

    data = jnp.array([0.3, -1.2, 2.0, 0.7])

    def loss(raw):
        m = ep.constrain(raw)
        return -jnp.sum(distrax.Normal(m.shift, m.scale).log_prob(data))

    def hand_loss(u, shift):
        scale = jax.nn.softplus(u)
        z = (data - shift) / scale
        return jnp.sum(0.5 * z**2 + jnp.log(scale) + 0.5 * jnp.log(2 * jnp.pi))

    raw = ep.unconstrain(Noise(jnp.array(1.3), jnp.array(0.1)))
    for _ in range(5):
        grads = eqx.filter_grad(loss)(raw)
        du, dshift = jax.grad(hand_loss, argnums=(0, 1))(raw.scale, raw.shift)
        _close(grads.scale, du, rtol=1e-5)
        _close(grads.shift, dshift, rtol=1e-5)
        raw = jtu.tree_map(lambda p, g: p - 0.1 * g, raw, grads)


# --------------------------------------------- the one parameter system (#12)


class Squashed(eqx.Module):
    a: jax.Array = ep.field(bijector=distrax.Sigmoid())
    b: jax.Array = ep.field(bijector=jax.nn.sigmoid)


def test_raw_distrax_and_callable_bijectors_go_through_the_adapter():
    model = Squashed(jnp.array(0.25), jnp.array(0.75))
    raw = ep.unconstrain(model, {"b": ep.ParamSpec(bijector=tfb.Sigmoid())})
    _close(raw.a, _logit(0.25))
    _close(raw.b, _logit(0.75))
    back = ep.constrain(Squashed(raw.a, raw.b))  # the callable is a forward
    _close(back.a, 0.25)
    _close(back.b, 0.75)
    trees = ep.bijector_tree(model)
    _close(trees.a.held.value.forward(0.0), 0.5)
    with pytest.raises(TypeError, match=r"Parameter `b`.*has no `inverse`"):
        ep.unconstrain(model)


class Scaled(eqx.Module):
    lengthscale: jax.Array = ep.field(constraint=C.positive, prior=GAMMA)
    width: jax.Array = ep.field(
        constraint=C.interval(0.1, 10.0),
        prior=ep.FixedDistrax(distrax.Normal, jnp.array(1.0), jnp.array(2.0)),
    )


def test_metadata_stops_at_parameter_nodes():
    model = Scaled(jnp.array([0.5, 1.5]), jnp.array(2.0))
    params = ep.parameterize(model)
    assert ep.is_bijector(params.lengthscale) and ep.is_bijector(params.width)
    # log_prior scores the constrained values, never param or the bounds
    expected = jnp.sum(distrax.Gamma(2.0, 1.0).log_prob(model.lengthscale))
    expected += distrax.Normal(1.0, 2.0).log_prob(2.0)
    _close(ep.log_prior(model), expected)
    _close(ep.log_prior(params), expected)
    # parameterize is idempotent; constrain/unconstrain leave nodes alone
    assert ep.parameterize(params) == params
    for f in (ep.constrain, ep.unconstrain):
        _close(ep.resolve(f(params)).width, 2.0)
        _close(ep.resolve(f(params)).lengthscale, model.lengthscale)
    # spec trees have the model's structure, with None inside nodes
    specs = ep.spec_tree(params)
    assert jtu.tree_structure(specs, is_leaf=IS_SPEC) == jtu.tree_structure(params)
    assert specs.width.param is None and specs.width.transform.low is None
    # a node outside its field's constraint is still caught
    bad = eqx.tree_at(lambda m: m.width, params, ep.positive(20.0))
    with pytest.raises(ValueError, match=r"`width`.*interval"):
        ep.unconstrain(bad)


def test_frozen_field_freezes_a_node_once():
    class K(eqx.Module):
        period: jax.Array = ep.field(constraint=C.positive, trainable=False)

    params = ep.parameterize(K(jnp.array(3.0)))
    assert isinstance(params.period, ep.Frozen)
    assert ep.is_bijector(params.period.value)
    assert ep.parameterize(params) == params


def test_checks_hold_under_jit():
    model = RBF(jnp.array([0.5, -2.0]), jnp.array(1.5))
    with pytest.raises(ValueError, match=r"`lengthscale`.*positive"):
        ep.unconstrain(model)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"`lengthscale`.*positive"):
        jax.block_until_ready(eqx.filter_jit(ep.unconstrain)(model))
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"`lengthscale`.*positive"):
        jax.block_until_ready(eqx.filter_jit(ep.parameterize)(model))


def test_log_prior_is_minus_inf_outside_the_support():
    class P(eqx.Module):
        g: jax.Array = ep.field(prior=distrax.Gamma(2.0, 1.0))
        e: jax.Array = ep.field(prior=tfp.distributions.Exponential(1e-5))
        b: jax.Array = ep.field(prior=distrax.Beta(2.0, 2.0))
        u: jax.Array = ep.field(prior=distrax.Uniform(0.0, 1.0))

    inside = P(jnp.array(1.0), jnp.array(1.0), jnp.array(0.5), jnp.array(0.5))
    assert np.isfinite(ep.log_prior(inside))
    for where in (lambda m: m.g, lambda m: m.e, lambda m: m.b, lambda m: m.u):
        outside = eqx.tree_at(where, inside, jnp.array(-1.0))
        assert ep.log_prior(outside) == -np.inf
        assert eqx.filter_jit(ep.log_prior)(outside) == -np.inf


def test_log_prior_rejects_a_prior_that_would_count_a_parameter_twice():
    class P(eqx.Module):
        x: jax.Array = ep.field(prior=distrax.Normal(jnp.zeros(3), 1.0))

    with pytest.raises(ValueError, match=r"`x`.*more than once"):
        ep.log_prior(P(jnp.array(0.5)))

    # a scalar prior over a vector parameter is iid: counted once per entry
    class Q(eqx.Module):
        x: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))

    _close(ep.log_prior(Q(jnp.zeros(3))), 3 * distrax.Normal(0.0, 1.0).log_prob(0.0))


def test_a_bijector_whose_range_leaves_its_constraint_is_an_error():
    class P(eqx.Module):
        p: jax.Array = ep.field(constraint=C.unit_interval, bijector=tfb.Exp())

    with pytest.raises(ValueError, match=r"`p` has the bijector .*Exp.*range leaves"):
        ep.unconstrain(P(jnp.array(0.5)))
    with pytest.raises(ValueError, match="range leaves"):
        ep.parameterize(P(jnp.array(0.5)))
    with pytest.raises(ValueError, match="range leaves"):
        ep.constrain(P(jnp.array(0.0)))


def test_an_override_giving_only_a_prior_keeps_the_field_constraint():
    model = RBF(jnp.array([0.5, 2.0]), jnp.array(1.5))
    prior = ep.FixedDistrax(tfp.distributions.LogNormal, jnp.array(0.0), 1.0)
    overrides = ep.WhereDict({"lengthscale": ep.ParamSpec(prior=prior)})
    spec = ep.spec_tree(model, overrides).lengthscale
    assert spec.constraint is C.positive and spec.prior is prior
    raw = ep.unconstrain(model, overrides)
    _close(raw.lengthscale, _inv_softplus(model.lengthscale))
    _close(
        ep.log_prior(model, overrides),
        jnp.sum(tfp.distributions.LogNormal(0.0, 1.0).log_prob(model.lengthscale)),
    )


def test_two_overrides_of_one_node_are_an_error():
    model = {"layers": [jnp.array(1.0), jnp.array(2.0)]}
    overrides = ep.WhereDict(
        {
            lambda m: m["layers"][-1]: ep.ParamSpec(constraint=C.positive),
            lambda m: m["layers"][1]: ep.ParamSpec(trainable=False),
        }
    )
    with pytest.raises(ValueError, match=r"select the same node `\['layers'\]\[1\]`"):
        ep.spec_tree(model, overrides)


def test_specs_on_leaves_that_cannot_train_are_errors():
    class IntLeaf(eqx.Module):
        n: jax.Array = ep.field(constraint=C.positive)

    with pytest.raises(TypeError, match=r"`n` .* dtype int32"):
        ep.unconstrain(IntLeaf(jnp.array(3)))
    with pytest.raises(TypeError, match=r"`n` .* Python float"):
        ep.parameterize(IntLeaf(0.5))  # pyright: ignore[reportArgumentType]


def test_numpyro_constraint_and_prior_in_a_field():
    dist = pytest.importorskip("numpyro.distributions")

    class P(eqx.Module):
        s: jax.Array = ep.field(
            constraint=dist.constraints.positive, prior=dist.Gamma(2.0, 1.0)
        )

    model = P(jnp.array([0.5, 2.0]))
    _close(ep.unconstrain(model).s, _inv_softplus(model.s))
    _close(ep.log_prior(model), jnp.sum(dist.Gamma(2.0, 1.0).log_prob(model.s)))
    assert ep.log_prior(P(jnp.array([-1.0, 2.0]))) == -np.inf


def test_log_prior_support_through_wrappers_and_special_supports():
    class M(eqx.Module):
        x: jax.Array

    def score(prior, value):
        overrides = {lambda m: m.x: ep.ParamSpec(prior=prior)}
        return ep.log_prior(M(jnp.asarray(value)), overrides)

    tfd = tfp.distributions
    gamma2 = distrax.Independent(distrax.Gamma(2 * jnp.ones(2), jnp.ones(2)), 1)
    cases = [
        (gamma2, [-1.0, 1.0], [1.0, 1.0]),
        (tfd.Sample(tfd.Exponential(1.0), 2), [-1.0, 1.0], [1.0, 1.0]),
        (tfd.TransformedDistribution(tfd.Normal(0.0, 1.0), tfb.Exp()), -1.0, 1.0),
        (distrax.Transformed(distrax.Normal(0.0, 1.0), distrax.Sigmoid()), 1.5, 0.5),
        (tfd.WishartTriL(4.0, jnp.eye(2)), -jnp.eye(2), jnp.eye(2)),
        (tfd.LKJ(3, 2.0), 2 * jnp.eye(3), jnp.eye(3)),
        (tfd.Poisson(1.0), 1.5, 1.0),
    ]
    for prior, outside, inside in cases:
        assert score(prior, outside) == -np.inf, prior
        expected = jnp.sum(prior.log_prob(jnp.asarray(inside)))
        _close(score(prior, inside), expected)


def test_a_prior_support_is_decided_by_its_class_not_its_name():
    # A user's real-line prior that happens to be called `Gamma` is scored by its
    # own density (it got Gamma's support, -inf below 0); the library's own
    # Gamma classes keep theirs, raw or wrapped.
    class Gamma(distrax.Normal):
        pass

    class M(eqx.Module):
        x: jax.Array

    def score(prior, value):
        overrides = {lambda m: m.x: ep.ParamSpec(prior=prior)}
        return ep.log_prior(M(jnp.asarray(value)), overrides)

    expected = distrax.Normal(0.0, 1.0).log_prob(-1.0)
    _close(score(Gamma(0.0, 1.0), -1.0), expected)
    _close(score(ep.FixedDistrax(Gamma, 0.0, 1.0), -1.0), expected)
    for prior in (distrax.Gamma(2.0, 1.0), tfp.distributions.Gamma(2.0, 1.0)):
        assert score(prior, -1.0) == -np.inf
        assert score(ep.FixedDistrax.from_instance(prior), -1.0) == -np.inf


def test_a_node_whose_bijector_leaves_an_override_constraint_is_an_error():
    class K(eqx.Module):
        ls: jax.Array = ep.field(constraint=C.positive)

    params = ep.parameterize(K(jnp.array(1.5)))
    overrides = {lambda m: m.ls: ep.ParamSpec(constraint=C.interval(0.0, 2.0))}
    with pytest.raises(ValueError, match=r"`ls` has the bijector softplus"):
        ep.parameterize(params, overrides)
    # a frozen node is never moved: only its value is checked
    frozen = eqx.tree_at(lambda m: m.ls, params, ep.frozen(params.ls))
    assert ep.parameterize(frozen, overrides) == frozen


def test_a_prior_that_cannot_score_the_parameter_names_it():
    class M(eqx.Module):
        x: jax.Array = ep.field(prior=tfp.distributions.Normal(jnp.zeros(2), 1.0))

    with pytest.raises(ValueError, match=r"prior of `x` cannot score"):
        ep.log_prior(M(jnp.zeros(3)))


class Many(eqx.Module):
    scales: list = ep.field(constraint=C.positive)
    bounded: list = ep.field(constraint=C.interval(-1.0, 2.0))


def _many(n=40):
    return Many(
        [jnp.asarray(0.1 + i, jnp.float32) for i in range(n)],
        [jnp.linspace(-0.9, 1.9, 3) * (i + 1) / n for i in range(n)],
    )


def test_the_batched_eager_path_equals_the_one_leaf_path():
    """Leaves sharing a transform go through one compiled call; the results must
    be the per-leaf shortcut's, bit for bit, and errors still name the leaf."""
    model = _many()
    raw = ep.unconstrain(model)
    for v, u in zip(model.scales, raw.scales):
        np.testing.assert_array_equal(u, ep.positive(v).param)
    for v, u in zip(model.bounded, raw.bounded):
        np.testing.assert_array_equal(u, ep.bounded(v, -1.0, 2.0).param)
    back = ep.constrain(raw)
    for v, w in zip(model.scales, back.scales):
        np.testing.assert_allclose(w, v, rtol=1e-6)
    params = ep.parameterize(model)
    assert all(ep.is_bijector(n) for n in params.scales + params.bounded)
    for v, n in zip(model.scales, params.scales):
        np.testing.assert_array_equal(n.param, ep.positive(v).param)
    assert ep.parameterize(params) == params
    spec = ep.trainable(params)
    assert all(n.param is True for n in spec.scales)
    bad = eqx.tree_at(lambda m: m.scales[27], model, jnp.asarray(-3.0))
    with pytest.raises(ValueError, match=r"`scales\[27\]`: the value must lie in"):
        ep.unconstrain(bad)
    with pytest.raises(ValueError, match=r"`scales\[27\]`"):
        ep.parameterize(bad)


def test_log_prior_of_many_leaves_sharing_a_wrapped_prior():
    class Rates(eqx.Module):
        rates: list = ep.field(constraint=C.positive, prior=GAMMA)

    values = [jnp.asarray(0.2 + 0.1 * i) for i in range(30)]
    model = Rates(values)
    expected = sum(distrax.Gamma(2.0, 1.0).log_prob(v) for v in values)
    _close(ep.log_prior(model), expected, rtol=1e-5)
    _close(ep.log_prior(ep.parameterize(model)), expected, rtol=1e-5)
    outside = eqx.tree_at(lambda m: m.rates[11], model, jnp.asarray(-1.0))
    assert ep.log_prior(outside) == -np.inf
    assert eqx.filter_jit(ep.log_prior)(outside) == -np.inf


# --- eager batching of many leaves (the fast path must equal the per-leaf one) ---


class _Many(eqx.Module):
    xs: list


def _many_with(prior, values, constraint=None):
    model = _Many([jnp.asarray(v) for v in values])
    spec = ep.ParamSpec(prior=prior, constraint=constraint)
    return model, {lambda m: m.xs: spec}


@pytest.mark.parametrize(
    "prior, values",
    [
        (distrax.Gamma(2.0, 1.0), [0.5, 1.0, 2.0, 3.0]),  # raw, scalar
        (
            distrax.MultivariateNormalDiag(jnp.zeros(3), jnp.ones(3)),  # raw, event
            [[0.1, 0.2, 0.3], [1.0, -1.0, 0.0], [2.0, 0.0, -2.0]],
        ),
        (
            tfp.distributions.Normal(jnp.zeros(2), jnp.ones(2)),  # raw, batch (2,)
            [[0.5, -0.5], [1.0, 2.0], [0.0, 0.0]],
        ),
        (
            ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0)),
            [[0.5, 1.5], [2.5, 3.5]],  # a scalar prior over vector leaves
        ),
    ],
)
def test_log_prior_of_many_leaves_equals_the_sum_of_raw_log_probs(prior, values):
    model, overrides = _many_with(prior, values)
    expected = sum(jnp.sum(prior.log_prob(jnp.asarray(v))) for v in values)
    _close(ep.log_prior(model, overrides), expected)
    _close(jax.jit(lambda m: ep.log_prior(m, overrides))(model), expected)


def test_log_prior_of_many_leaves_outside_the_support_is_minus_inf():
    model, overrides = _many_with(distrax.Gamma(2.0, 1.0), [0.5, -1.0, 2.0])
    assert ep.log_prior(model, overrides) == -np.inf


def test_log_prior_of_many_leaves_checks_the_batch_shape_once_per_group():
    prior = distrax.Normal(jnp.zeros(3), jnp.ones(3))  # batch (3,): counts 3 times
    model, overrides = _many_with(prior, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"`xs\[0\]`.*more than once"):
        ep.log_prior(model, overrides)


def test_a_float32_prior_scores_a_float64_parameter_in_float64():
    prior = ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0))  # f32
    with jax.enable_x64(True):
        value = jnp.array(1.0 + 1e-9, jnp.float64)  # not representable in f32
        model, overrides = _many_with(prior, [value, value])
        got = ep.log_prior(model, overrides)
        assert got.dtype == jnp.float64
        v = 1.0 + 1e-9  # Gamma(2, 1): log p(v) = log v - v
        np.testing.assert_allclose(float(got), 2 * (np.log(v) - v), rtol=1e-13)


def test_a_float32_raw_prior_that_cannot_be_wrapped_scores_in_float64():
    # distrax's MultivariateNormalTri keeps the lower triangle it computes, so it
    # is not rebuilt as a wrapper: it is cast as the PyTree it is (it raised a
    # dtype-promotion error).
    tril = jnp.array([[1.0, 0.0], [0.5, 2.0]])
    prior = distrax.MultivariateNormalTri(jnp.zeros(2), tril)  # float32

    class M(eqx.Module):
        x: jax.Array = ep.field(prior=prior)

    with jax.enable_x64(True):
        value = jnp.array([0.3, -0.2], jnp.float64)
        got = ep.log_prior(M(value))
        assert got.dtype == jnp.float64
        cov = np.asarray(tril, np.float64) @ np.asarray(tril, np.float64).T
        v = np.asarray(value)
        hand = -0.5 * (v @ np.linalg.solve(cov, v) + np.log(np.linalg.det(cov)))
        # (its cached factor was computed in float32, then cast)
        np.testing.assert_allclose(float(got), hand - np.log(2 * np.pi), rtol=1e-7)


def test_weakly_typed_leaves_come_back_strongly_typed_from_the_batched_path():
    values = [jnp.asarray(0.5 + i) for i in range(6)]  # Python floats: weak types
    assert all(v.weak_type for v in values)
    model, overrides = _many_with(None, values, ep.constraints.positive)
    for u, v in zip(ep.unconstrain(model, overrides).xs, values):
        _close(u, _inv_softplus(v))
        assert u.dtype == v.dtype and not u.weak_type


# --- red-team cases of the eager fast paths (each failed once) -------------------


def test_batched_leaves_keep_their_own_trainability():
    class A(eqx.Module):
        frozen_: jax.Array = ep.field(constraint=C.positive, trainable=False)
        train_: jax.Array = ep.field(constraint=C.positive)

    for model in (A(jnp.array(1.0), jnp.array(2.0)),):
        eager = ep.parameterize(model)
        traced = eqx.filter_jit(ep.parameterize)(model)
        for got in (eager, traced):
            assert isinstance(got.frozen_, ep.Frozen)
            assert ep.is_bijector(got.train_)


def test_array_bounds_in_a_list_field_eager_equals_jit():
    low = jnp.array([0.0, 1.0, 2.0])

    class M(eqx.Module):
        xs: list = ep.field(constraint=C.greater_than(low))

    model = M([jnp.array([0.5, 1.5, 2.5]), jnp.array([1.0, 2.0, 3.0])])
    jitted = eqx.filter_jit(ep.unconstrain)(model)  # first: must not leak tracers
    eager = ep.unconstrain(model)
    for e, j, v in zip(eager.xs, jitted.xs, model.xs):
        _close(e, j)
        _close(e, _inv_softplus(v - low))
    for back, v in zip(ep.constrain(eager).xs, model.xs):
        _close(back, v)
    for node, v in zip(ep.resolve(ep.parameterize(model)).xs, model.xs):
        _close(node, v)


def test_empty_leaves_next_to_others():
    class M(eqx.Module):
        xs: list = ep.field(constraint=C.real)

    model = M([jnp.ones((2,)), jnp.zeros((0,))])
    raw = ep.unconstrain(model)
    assert [x.shape for x in raw.xs] == [(2,), (0,)]
    t = ep.default_bijector(C.real)
    nodes = [ep.Bijector(jnp.ones((2,)), t), ep.Bijector(jnp.zeros((0,)), t)]
    assert [x.shape for x in ep.resolve(nodes)] == [(2,), (0,)]


def test_a_prior_that_validates_values_scores_minus_inf_outside_its_support():
    prior = tfp.distributions.Gamma(2.0, 1.0, validate_args=True)
    for values in ([-1.0], [-1.0, 2.0]):
        model = _Many([jnp.asarray(v) for v in values])
        overrides = {lambda m: m.xs: ep.ParamSpec(prior=prior)}
        assert ep.log_prior(model, overrides) == -np.inf
        assert jax.jit(lambda m, o=overrides: ep.log_prior(m, o))(model) == -np.inf


def test_weak_types_follow_the_per_leaf_path():
    weak = [jnp.asarray(0.5), jnp.asarray(1.5)]  # weakly typed
    model, overrides = _many_with(None, weak, C.positive)
    raw = ep.unconstrain(model, overrides)
    assert not any(x.weak_type for x in ep.constrain(raw, overrides).xs)
    node = ep.positive(1.0)
    weak_node = eqx.tree_at(lambda b: b.param, node, jnp.asarray(0.3))
    mixed = [weak_node, weak_node, node, node]
    assert [b.param.weak_type for b in mixed] == [True, True, False, False]
    eager = [x.weak_type for x in ep.resolve(mixed)]
    assert eager == [x.weak_type for x in jax.jit(ep.resolve)(mixed)]
    assert eager == [True, True, False, False]


def test_bfloat16_parameters_are_summed_in_float32():
    values = [jnp.asarray(0.1 * i, jnp.bfloat16) for i in range(300)]
    prior = distrax.Normal(0.0, 1.0)
    model, overrides = _many_with(prior, values)
    got = ep.log_prior(model, overrides)
    x = np.asarray([np.float64(np.asarray(v, np.float32)) for v in values])
    expected = np.sum(-0.5 * x**2 - 0.5 * np.log(2 * np.pi))  # in float64
    assert got.dtype == jnp.float32
    # bfloat16 log-densities (8 bits of mantissa), summed in float32
    np.testing.assert_allclose(float(got), expected, rtol=1e-2)
    traced = jax.jit(lambda m, o=overrides: ep.log_prior(m, o))(model)
    np.testing.assert_allclose(float(traced), expected, rtol=1e-2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 0.0, -1e-30])
def test_a_bad_value_among_many_is_named(bad):
    values = [0.5 + i for i in range(8)]
    values[5] = bad
    model, overrides = _many_with(None, values, C.positive)
    for op in (ep.unconstrain, ep.parameterize):
        with pytest.raises(ValueError, match=r"`xs\[5\]`"):
            op(model, overrides)


def test_eager_fast_paths_from_eight_threads_equal_one_thread():
    import concurrent.futures

    def run(seed):
        values = [0.1 + seed + 0.5 * i for i in range(40)]
        model, overrides = _many_with(distrax.Gamma(2.0, 1.0), values, C.positive)
        raw = ep.unconstrain(model, overrides)
        params = ep.parameterize(model, overrides)
        return (
            [np.asarray(x) for x in raw.xs],
            [np.asarray(x) for x in ep.constrain(raw, overrides).xs],
            [np.asarray(x) for x in ep.resolve(params).xs],
            float(ep.log_prior(model, overrides)),
        )

    sequential = [run(seed) for seed in range(16)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(run, range(16)))
    for one, other in zip(sequential, threaded):
        for a, b in zip(one[:3], other[:3]):
            np.testing.assert_array_equal(np.stack(a), np.stack(b))
        assert one[3] == other[3]


def test_models_of_one_layout_keep_their_own_metadata():
    """Specs are looked up per structure: classes with the same layout but other
    metadata, and a static field that cannot be hashed, each get their own."""

    class A(eqx.Module):
        x: jax.Array = ep.field(constraint=C.positive)

    class B(eqx.Module):
        x: jax.Array = ep.field(constraint=C.interval(0.0, 2.0))

    class S(eqx.Module):
        x: jax.Array = ep.field(constraint=C.positive)
        tag: np.ndarray = eqx.field(static=True)  # pyright: ignore[reportGeneralTypeIssues]

    v = jnp.array(0.5)
    for _ in range(2):  # the second round reads what the first one stored
        _close(ep.unconstrain(A(v)).x, _inv_softplus(v))
        _close(ep.unconstrain(B(v)).x, _logit(v / 2.0))
        with pytest.warns(UserWarning, match="static"):  # Equinox's warning
            s, t = S(v, np.arange(3.0)), S(v, np.arange(3.0))
        with pytest.raises(ValueError):  # their treedefs cannot be compared
            _ = jtu.tree_structure(s) == jtu.tree_structure(t)
        _close(ep.unconstrain(t).x, _inv_softplus(v))
        _close(ep.unconstrain(s).x, _inv_softplus(v))
        over = {lambda m: m.x: ep.ParamSpec(constraint=C.interval(0.0, 1.0))}
        _close(ep.unconstrain(A(v), over).x, _logit(v))
        _close(ep.unconstrain(A(v)).x, _inv_softplus(v))  # overrides not kept


class _Dict(eqx.Module):
    d: dict = ep.field(constraint=C.positive)


def test_a_structure_seen_before_is_labelled_with_this_models_dict_keys():
    # {True: x}, {1: x} and {1.0: x} have equal treedefs (True == 1 == 1.0): the
    # label must name the key of the model at hand (found by the red team).
    ep.unconstrain(_Dict({True: jnp.array(1.0)}))
    with pytest.raises(ValueError, match=r"d\[1\.0\]"):
        ep.unconstrain(_Dict({1.0: jnp.array(-1.0)}))
    ep.summary(_Dict({np.int64(3): jnp.array(1.0)}))
    table = str(ep.summary(_Dict({3: jnp.array(1.0)})))
    assert "d[3]" in table and "int64" not in table, table


@pytest.mark.parametrize(
    "shortcut, constraint",
    [(ep.positive, "positive"), (ep.simplex, "simplex"), (ep.bounded, "interval")],
)
def test_a_shortcut_given_as_a_constraint_names_the_constraint(shortcut, constraint):
    with pytest.raises(TypeError, match=rf"`ep.constraints.{constraint}"):
        ep.field(constraint=shortcut)


def test_ep_field_on_a_plain_dataclass_is_an_error_naming_it_and_the_fix():
    """A plain dataclass is one leaf to JAX: its `ep.field` metadata would be
    silently ignored (no constraint, no prior)."""
    import dataclasses

    @dataclasses.dataclass
    class Kernel:
        lengthscale: Any = ep.field(constraint=ep.constraints.positive)

    class Model(eqx.Module):
        kernel: Any
        noise: jax.Array = ep.field(constraint=ep.constraints.positive)

    model = Model(Kernel(jnp.array(1.0)), jnp.array(0.1))
    calls = [ep.parameterize, ep.spec_tree, ep.unconstrain, ep.log_prior, ep.summary]
    for call in calls:
        with pytest.raises(TypeError, match=r"`kernel` is a Kernel, a dataclass.*eqx"):
            call(model)
    with pytest.raises(TypeError, match=r"`\(root\)` is a Kernel"):
        ep.parameterize(Kernel(jnp.array(1.0)))
    # The same field on an Equinox module: read.

    class ModuleKernel(eqx.Module):
        lengthscale: Any = ep.field(constraint=ep.constraints.positive)

    spec = ep.spec_tree(ModuleKernel(jnp.array(1.0))).lengthscale
    assert spec.constraint is ep.constraints.positive
