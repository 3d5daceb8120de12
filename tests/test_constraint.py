"""Every constraint, as a matrix: check, default bijector, round trips in float32 and
float64, log-det against `slogdet(jax.jacfwd(...))` on the free coordinates, priors
pushed back to unconstrained space integrating to one, and checks under `jit`.

References are independent of the code under test: hand-written NumPy supports,
autodiff Jacobians, raw distrax/TFP densities and numerical integration.
"""

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions
C = ep.constraints


@dataclasses.dataclass(frozen=True)
class Case:
    constraint: Any
    inside: Callable[[], np.ndarray]  # a valid value (float64 NumPy)
    outside: list  # values that must be rejected
    free: Callable = lambda y: y.reshape(-1)  # noqa: E731  the free coordinates
    shortcut: Callable | None = None


def _corr(n):
    a = np.linspace(-0.4, 0.5, n * n).reshape(n, n)
    cov = a @ a.T + np.eye(n)
    d = np.sqrt(np.diag(cov))
    return np.linalg.cholesky(cov / np.outer(d, d))


CASES = {
    "real": Case(C.real, lambda: np.array([-2.0, 0.0, 3.5]), [np.nan, np.inf]),
    "positive": Case(
        C.positive,
        lambda: np.array([1e-3, 1.0, 40.0]),
        [0.0, -1.0, np.inf, np.nan],
        shortcut=ep.positive,
    ),
    "nonnegative": Case(
        C.nonnegative,
        lambda: np.array([0.0, 0.5, 7.0]),
        [-1e-3, np.inf, np.nan],
        shortcut=ep.nonnegative,
    ),
    "greater_than": Case(
        C.greater_than(-2.0), lambda: np.array([-1.5, 0.0, 9.0]), [-2.0, -3.0, np.inf]
    ),
    "less_than": Case(
        C.less_than(1.0), lambda: np.array([-5.0, 0.0, 0.9]), [1.0, 2.0, -np.inf]
    ),
    "interval": Case(
        C.interval(-1.0, 3.0),
        lambda: np.array([-0.9, 0.5, 2.9]),
        [-1.0, 3.0, 4.0, np.nan],
        shortcut=lambda v: ep.bounded(v, -1.0, 3.0),
    ),
    "unit_interval": Case(
        C.unit_interval, lambda: np.array([0.01, 0.5, 0.99]), [0.0, 1.0, -0.1]
    ),
    "simplex": Case(
        C.simplex,
        lambda: np.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]),
        [[0.5, 0.6], [0.0, 1.0], [-0.1, 1.1], [np.nan, 1.0]],
        free=lambda y: y[..., :-1].reshape(-1),
        shortcut=ep.simplex,
    ),
    "lower_cholesky": Case(
        C.lower_cholesky,
        lambda: np.array([[1.5, 0.0, 0.0], [-0.3, 0.2, 0.0], [2.0, 0.7, 3.0]]),
        [[[1.0, 2.0], [0.0, 1.0]], [[1.0, 0.0], [3.0, -1.0]], [[0.0, 0.0], [1, 1]]],
        free=lambda y: y[np.tril_indices(y.shape[-1])],
        shortcut=ep.lower_cholesky,
    ),
    "positive_definite": Case(
        C.positive_definite,
        lambda: np.array([[2.0, 0.5, 0.1], [0.5, 1.0, -0.2], [0.1, -0.2, 0.8]]),
        [[[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.5], [0.0, 1.0]], [[1, 0], [0, -1e-3]]],
        free=lambda y: y[np.tril_indices(y.shape[-1])],
        shortcut=ep.positive_definite,
    ),
    "corr_cholesky": Case(
        C.corr_cholesky,
        lambda: _corr(3),
        [[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.1], [0.0, 1.0]], [[-1.0, 0], [0, 1]]],
        free=lambda y: y[np.tril_indices(y.shape[-1], -1)],
        shortcut=ep.corr_cholesky,
    ),
}
cases = pytest.mark.parametrize("name", CASES, ids=list(CASES))
DTYPES = pytest.mark.parametrize("dtype", ["float32", "float64"])
RTOL = {"float32": 2e-6, "float64": 1e-12}


@cases
def test_check_accepts_inside_and_rejects_outside(name):
    case = CASES[name]
    c = case.constraint
    assert np.all(np.asarray(c.check(jnp.asarray(case.inside(), jnp.float32))))
    for bad in case.outside:
        assert not np.any(np.asarray(c.check(jnp.asarray(bad, jnp.float32)))), bad


@cases
@DTYPES
def test_round_trip_through_the_default_bijector(name, dtype):
    """The shortcut, `Bijector.from_value(constraint=...)` and the registry agree,
    keep the dtype, and round-trip to rounding."""
    case = CASES[name]
    with jax.enable_x64(dtype == "float64"):
        v = case.inside().astype(dtype)
        node = ep.Bijector.from_value(v, constraint=case.constraint)
        assert node.param.dtype == dtype
        np.testing.assert_allclose(ep.resolve(node), v, rtol=RTOL[dtype], atol=1e-30)
        if case.shortcut is not None:
            np.testing.assert_array_equal(case.shortcut(v).param, node.param)

        class M(eqx.Module):
            x: jax.Array = ep.field(constraint=case.constraint)

        raw = ep.unconstrain(M(jnp.asarray(v)))
        np.testing.assert_array_equal(raw.x, node.param)
        np.testing.assert_allclose(ep.constrain(raw).x, v, rtol=RTOL[dtype], atol=1e-30)
        jitted = eqx.filter_jit(ep.unconstrain)(M(jnp.asarray(v)))
        np.testing.assert_allclose(jitted.x, node.param, rtol=1e-5, atol=1e-6)


@cases
def test_log_det_is_slogdet_of_the_jacobian_onto_the_free_coordinates(name):
    case = CASES[name]
    with jax.enable_x64(True):
        node = ep.Bijector.from_value(case.inside(), constraint=case.constraint)
        t = node.transform
        if case.constraint.event_ndim == 0:  # elementwise: a diagonal Jacobian
            jac = jax.vmap(jax.grad(t.forward))(node.param)
            expected = np.sum(np.log(np.abs(np.asarray(jac))))
        else:
            params = node.param.reshape(-1, node.param.shape[-1])
            expected = 0.0
            for p in params:
                jac = jax.jacfwd(lambda x: case.free(t.forward(x)))(p)
                expected += np.linalg.slogdet(np.asarray(jac))[1]
        np.testing.assert_allclose(ep.log_det_jacobian(node), expected, rtol=1e-10)


# Priors and the 1-D or 2-D unconstrained grids to integrate them over.
PRIORS = {
    "real": (C.real, tfd.Normal(0.5, 2.0), (-30, 30)),
    "positive": (C.positive, distrax.Gamma(2.0, 1.5), (-40, 25)),
    "nonnegative": (C.nonnegative, tfd.HalfNormal(1.5), (-40, 25)),
    "greater_than": (
        C.greater_than(1.0),
        tfd.Gamma(2.0, 1.0, force_probs_to_zero_outside_support=True),
        (-40, 25),
    ),
    "less_than": (C.less_than(-1.0), tfd.Gamma(2.0, 1.0), (-40, 25)),
    "unit_interval": (C.unit_interval, distrax.Beta(2.0, 3.0), (-40, 40)),
    "interval": (C.interval(-1.0, 3.0), distrax.Uniform(-1.0, 3.0), (-40, 40)),
    "simplex (n=2)": (C.simplex, tfd.Dirichlet(jnp.array([2.0, 3.0])), (-40, 40)),
    # Tails decay as u^-4 only: integrate far out.
    "corr_cholesky (n=2)": (C.corr_cholesky, tfd.CholeskyLKJ(2, 1.5), (-4e3, 4e3)),
    "lower_cholesky (n=1)": (C.lower_cholesky, None, (-40, 25)),
    "positive_definite (n=1)": (C.positive_definite, None, (-40, 25)),
}


def _shifted_gamma_log_prob(c, prior):
    # greater_than(1): Gamma of (v - 1), a density on (1, inf); less_than(-1):
    # Gamma of (-1 - v), a density on (-inf, -1).
    if isinstance(c, C.GreaterThan):
        return lambda v: prior.log_prob(v - 1.0)
    return lambda v: prior.log_prob(-1.0 - v)


@pytest.mark.standard_promotion(
    "TFP's own log_prob code: numpy_math.py:1068, half_normal.py:148, normal.py:185, "
    "cholesky_lkj.py:230"
)
@pytest.mark.parametrize("name", PRIORS, ids=list(PRIORS))
def test_a_prior_pushed_back_integrates_to_one(name):
    """exp(log p(f(u)) + log|det J f(u)|) over the unconstrained line is 1: the
    log-det is the density correction for the prior's own measure."""
    constraint, prior, (lo, hi) = PRIORS[name]
    with jax.enable_x64(True):
        bijector = ep.default_bijector(constraint)
        if name.startswith("lower_cholesky"):  # L = [[l]], l > 0: HalfNormal
            log_prob = lambda y: tfd.HalfNormal(1.0).log_prob(y[..., 0, 0])  # noqa: E731
        elif name.startswith("positive_definite"):  # [[s]]: Wishart(df=3) = Gamma
            wishart = tfd.WishartTriL(3.0, jnp.eye(1), input_output_cholesky=False)
            log_prob = wishart.log_prob
        elif name in ("greater_than", "less_than"):
            log_prob = _shifted_gamma_log_prob(constraint, prior)
        else:
            log_prob = prior.log_prob
        u = jnp.linspace(lo, hi, 400_001)

        def density(u):
            x = u[None] if constraint.event_ndim else u
            node = ep.Bijector(x, bijector)
            return jnp.exp(log_prob(ep.resolve(node)) + ep.log_det_jacobian(node))

        values = jax.jit(jax.vmap(density))(u)
        total = np.trapezoid(np.asarray(values), np.asarray(u))
        np.testing.assert_allclose(total, 1.0, rtol=1e-6)


def test_dirichlet_on_the_3_simplex_integrates_to_one_over_the_plane():
    with jax.enable_x64(True):
        prior = tfd.Dirichlet(jnp.array([1.5, 2.0, 3.0]))
        grid = jnp.linspace(-30, 30, 1501)
        u = jnp.stack(jnp.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)

        def density(u):
            node = ep.simplex(jnp.full(3, 1 / 3))
            node = eqx.tree_at(lambda n: n.param, node, u)
            return jnp.exp(prior.log_prob(ep.resolve(node)) + ep.log_det_jacobian(node))

        values = np.asarray(jax.jit(jax.vmap(density))(u)).reshape(1501, 1501)
        total = np.trapezoid(np.trapezoid(values, grid), grid)
        np.testing.assert_allclose(total, 1.0, rtol=1e-5)
        # TFP's own SoftmaxCentered convention would give sqrt(3) here.


@cases
def test_outside_values_are_errors_eagerly_and_under_jit(name):
    case = CASES[name]
    for bad in case.outside:
        bad = jnp.asarray(bad, jnp.float32)
        with pytest.raises(
            ValueError, match=re.escape(f"must lie in {case.constraint!r}")
        ):
            ep.Bijector.from_value(bad, constraint=case.constraint)
        build = eqx.filter_jit(
            lambda v: ep.Bijector.from_value(v, constraint=case.constraint)
        )
        with pytest.raises(eqx.EquinoxRuntimeError, match="must lie in"):
            jax.block_until_ready(build(bad))


def test_interval_with_an_infinite_bound_is_the_one_sided_constraint():
    assert C.interval(0.0, np.inf) == C.greater_than(0.0)
    assert C.interval(-np.inf, 2.0) == C.less_than(2.0)
    assert C.interval(-np.inf, np.inf) is C.real
    p = ep.bounded(3.0, 1.0, jnp.inf)
    np.testing.assert_allclose(ep.resolve(p), 3.0, rtol=1e-6)
    assert np.isfinite(ep.log_det_jacobian(p))
    with pytest.raises(ValueError, match="`high` must be finite"):
        C.Interval(0.0, np.inf)
    with pytest.raises(ValueError, match="`low` must be smaller"):
        C.interval(1.0, 0.0)
    with pytest.raises(ValueError, match="`low` must be finite"):
        C.interval(np.nan, 1.0)


def test_simplex_tolerance_is_one_rule():
    """`ep.simplex` and `constraints.simplex` accept and reject the same sums."""
    for dtype in (np.float32, np.float64):
        tol = np.sqrt(np.finfo(dtype).eps)
        with jax.enable_x64(dtype is np.float64):
            for excess, ok in [(0.5 * tol, True), (3 * tol, False)]:
                v = np.array([0.5, 0.5 + excess], dtype)
                assert bool(C.simplex.check(jnp.asarray(v))) is ok
                if ok:
                    ep.simplex(v)
                else:
                    with pytest.raises(ValueError, match="simplex"):
                        ep.simplex(v)


EXTREMES = {
    "tiny float32 positive": (lambda: ep.positive(np.finfo(np.float32).tiny), 1e-6),
    "tiny float64 positive": (lambda: ep.positive(np.finfo(np.float64).tiny), 1e-6),
    "huge bounds": (lambda: ep.bounded(0.0, -0.75 * 3.4e38, 0.75 * 3.4e38), None),
}


@pytest.mark.parametrize("name", EXTREMES, ids=list(EXTREMES))
def test_extreme_values_give_the_right_answer_or_an_error(name):
    make, rtol = EXTREMES[name]
    with jax.enable_x64("float64" in name):
        try:
            node = make()
        except ValueError as e:
            assert "cannot be represented" in str(e)
            return
        value = np.asarray(ep.resolve(node))
        assert np.isfinite(ep.log_det_jacobian(node))
        if rtol is not None:
            target = np.finfo(value.dtype).tiny
            np.testing.assert_allclose(value, target, rtol=rtol)


def test_huge_bounds_have_the_finite_log_det():
    m = np.finfo(np.float32).max
    node = ep.bounded(0.0, -0.75 * m, 0.75 * m)
    expected = np.log(1.5 * np.float64(m)) + 2 * np.log(0.5)  # width · σ'(0)
    np.testing.assert_allclose(ep.log_det_jacobian(node), expected, rtol=1e-6)


BAD_KINDS = {
    "complex": (lambda: ep.positive(1.0 + 2.0j), TypeError, "complex"),
    "string": (lambda: ep.positive("1.0"), TypeError, "real array"),  # pyright: ignore[reportArgumentType]
    "nan param": (lambda: ep.Bijector(jnp.nan, jax.nn.softplus), ValueError, "finite"),
    "inf param": (lambda: ep.Bijector(jnp.inf, jax.nn.softplus), ValueError, "finite"),
    "unknown constraint": (
        lambda: ep.Bijector.from_value(1.0, constraint="positive"),
        TypeError,
        "must be an `ep.constraints` member",
    ),
}


@pytest.mark.parametrize("name", BAD_KINDS, ids=list(BAD_KINDS))
def test_bad_kinds_of_input_are_clear_errors(name):
    make, error, match = BAD_KINDS[name]
    with pytest.raises(error, match=match):
        make()


def test_integers_become_floats():
    node = ep.positive(np.array([1, 2, 3]))
    assert jnp.issubdtype(node.param.dtype, jnp.floating)
    np.testing.assert_allclose(ep.resolve(node), [1, 2, 3], rtol=1e-6)


def test_constraint_is_abstract_and_custom_ones_register():
    with pytest.raises(TypeError):
        C.Constraint()  # pyright: ignore[reportAbstractUsage]

    class NoCheck(C.Constraint):
        event_ndim = 1

    with pytest.raises(TypeError, match="abstract method.*check"):
        NoCheck()  # pyright: ignore[reportAbstractUsage]

    class Negative(C.Constraint):
        def check(self, value):
            return (value < 0) & jnp.isfinite(value)

    @ep.register_bijector(Negative)
    def _(c):
        return ep.FixedDistrax(
            tfp.bijectors.Chain,
            [
                ep.FixedDistrax(tfp.bijectors.Scale, jnp.array(-1.0)),
                ep.FixedDistrax(tfp.bijectors.Exp),
            ],
        )

    node = ep.Bijector.from_value(jnp.array([-2.0, -0.5]), constraint=Negative())
    np.testing.assert_allclose(ep.resolve(node), [-2.0, -0.5], rtol=1e-6)
    np.testing.assert_allclose(ep.log_det_jacobian(node), np.sum(node.param), rtol=1e-6)
    with pytest.raises(ValueError, match="must lie in"):
        ep.Bijector.from_value(1.0, constraint=Negative())


def test_numpyro_constraints_map_to_ours():
    numpyro_constraints = pytest.importorskip("numpyro.distributions.constraints")
    pairs = [
        (numpyro_constraints.positive, C.positive),
        (numpyro_constraints.real, C.real),
        (numpyro_constraints.nonnegative, C.nonnegative),
        (numpyro_constraints.unit_interval, C.unit_interval),
        (numpyro_constraints.simplex, C.simplex),
        (numpyro_constraints.lower_cholesky, C.lower_cholesky),
        (numpyro_constraints.positive_definite, C.positive_definite),
        (numpyro_constraints.corr_cholesky, C.corr_cholesky),
        (numpyro_constraints.interval(0.0, 2.0), C.interval(0.0, 2.0)),
        (numpyro_constraints.greater_than(1.0), C.greater_than(1.0)),
        (numpyro_constraints.less_than(1.0), C.less_than(1.0)),
    ]
    for theirs, ours in pairs:
        spec = ep.ParamSpec(constraint=theirs)
        assert spec.constraint == ours, theirs
    # and they use the same default bijectors
    node = ep.Bijector.from_value(
        0.5, constraint=numpyro_constraints.interval(0.0, 2.0)
    )
    assert node.param == ep.bounded(0.5, 0.0, 2.0).param


# ------------------------------------------------------------ property tests

SCALAR = ["real", "positive", "nonnegative", "greater_than", "less_than", "interval"]


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(SCALAR), st.floats(-0.95, 0.95)),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
)
def test_random_models_round_trip_eagerly_and_under_jit(entries, jitted):
    """`constrain(unconstrain(m)) == m` and `resolve(parameterize(m)) == m` for
    random models over the scalar constraints."""
    fields, values = {}, {}
    for i, (name, t) in enumerate(entries):
        c = CASES[name].constraint
        lo, hi = {
            "real": (-50, 50),
            "positive": (1e-3, 1e3),
            "nonnegative": (0, 1e3),
            "greater_than": (-1.9, 100),
            "less_than": (-100, 0.9),
            "interval": (-0.99, 2.99),
        }[name]
        fields[f"x{i}"] = ep.field(constraint=c)
        values[f"x{i}"] = jnp.float32(lo + (hi - lo) * (t + 1) / 2)
    M = type(
        "M",
        (eqx.Module,),
        {"__annotations__": dict.fromkeys(fields, jax.Array), **fields},
    )
    model = M(**values)
    f = eqx.filter_jit if jitted else (lambda g: g)
    back = f(lambda m: ep.constrain(ep.unconstrain(m)))(model)
    again = f(lambda m: ep.resolve(ep.parameterize(m)))(model)
    for k, v in values.items():
        np.testing.assert_allclose(getattr(back, k), v, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(getattr(again, k), v, rtol=1e-5, atol=1e-6)


# ------------------------------------------- found by the red team, kept fixed

tfb = tfp.bijectors


def test_constant_jacobian_of_a_tfp_chain_is_broadcast_over_the_batch():
    node = ep.Bijector(jnp.zeros(3), tfb.Chain([tfb.Scale(3.0), tfb.Shift(1.0)]))
    np.testing.assert_allclose(ep.log_det_jacobian(node), 3 * np.log(3.0), rtol=1e-6)


def test_softmax_centered_inside_a_composite_is_an_error_not_a_wrong_log_det():
    x = jnp.array([0.3, -0.2])
    alone = ep.log_det_jacobian(ep.Bijector(x, tfb.SoftmaxCentered()))
    ours = ep.log_det_jacobian(ep.Bijector(x, ep.default_bijector(C.simplex)))
    np.testing.assert_allclose(alone, ours, rtol=1e-6)
    with pytest.raises(TypeError, match="contains `tfb.SoftmaxCentered`"):
        ep.log_det_jacobian(ep.Bijector(x, tfb.Chain([tfb.SoftmaxCentered()])))


def test_one_by_one_correlation_factor():
    node = ep.corr_cholesky(jnp.eye(1))
    assert node.param.shape == (0,)
    np.testing.assert_array_equal(ep.resolve(node), [[1.0]])


def test_an_infinite_bound_with_a_traced_other_bound():
    grad = jax.grad(lambda low: ep.resolve(ep.bounded(0.3, low, jnp.inf)))(0.0)
    np.testing.assert_allclose(grad, 0.0, atol=1e-6)  # the value is held at 0.3


def test_float32_stays_float32_with_float64_bounds():
    with jax.enable_x64(True):
        node = ep.bounded(jnp.float32(0.3), 0.0, 1.0)
        assert ep.resolve(node).dtype == jnp.float32
        assert ep.log_det_jacobian(node).dtype == jnp.float32
        node = ep.Bijector.from_value(jnp.float32(2.0), constraint=C.greater_than(1.0))
        assert ep.resolve(node).dtype == jnp.float32


def test_shape_errors_name_the_function():
    with pytest.raises(ValueError, match="ep.bounded: the value .* must broadcast"):
        ep.bounded(jnp.zeros(3) + 0.5, jnp.zeros(2), jnp.ones(2))

    class Bad(C.Constraint):
        event_ndim = 1

        def check(self, value):
            return value > 0  # one flag per entry, not per vector

    with pytest.raises(TypeError, match="Bad.check returned shape"):
        ep.Bijector.from_value(jnp.ones(3), jax.nn.softplus, constraint=Bad())


def test_bijector_param_must_be_an_array_or_a_node():
    with pytest.raises(TypeError, match="`param` must be an array"):
        ep.Bijector("abc", jnp.exp)
    np.testing.assert_allclose(
        ep.resolve(ep.Bijector([1.0, 2.0], jnp.exp)), np.exp([1.0, 2.0]), rtol=1e-6
    )


def test_filter_spec_of_a_node_prints_its_bools():
    spec = ep.trainable(ep.positive(1.5))
    assert "True" in repr(spec) and "1.31" not in repr(spec)
    assert repr(ep.positive(1.5)) == "Bijector(1.5, softplus)"
