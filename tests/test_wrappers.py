"""`FixedDistrax` beyond the conformance matrix: method uniformity, the float policy,
bad inputs, and training."""

import functools
import io
import re
import threading

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import numpyro
import numpyro.distributions as nd
import optax
import pytest
from _compiles import Compilations
from _hlo import hlo_op_count
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions
tfb = tfp.bijectors
KEY = jax.random.PRNGKey(0)
X = jnp.array([0.3, -0.2, 0.5])


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol, atol)


# --- construction and access -------------------------------------------------


def test_repr_names_class_and_arguments():
    d = ep.FixedDistrax(distrax.Normal, jnp.zeros(3), scale=jnp.ones(3))
    assert repr(d) == "FixedDistrax(Normal, loc=f32[3], scale=f32[3])"
    nested = ep.FixedDistrax(distrax.Independent, d, 1)
    assert repr(nested) == (
        "FixedDistrax(Independent, distribution=FixedDistrax(Normal, loc=f32[3], "
        "scale=f32[3]), reinterpreted_batch_ndims=1)"
    )


def test_arguments_by_name_and_instantiate():
    loc, scale = jnp.zeros(3), jnp.ones(3)
    d = ep.FixedDistrax(tfd.Normal, loc, scale, name="N")
    assert d.arguments == {"loc": loc, "scale": scale, "name": "N"}
    assert d.loc is loc and d.scale is scale
    raw = d.instantiate()
    assert isinstance(raw, tfd.Normal) and raw.name == "N"


def test_other_attributes_fall_through_to_the_instance():
    tril = jnp.array([[1.0, 0.0], [0.5, 2.0]])
    d = ep.FixedDistrax(distrax.MultivariateNormalTri, jnp.zeros(2), tril)
    _close(d.covariance(), tril @ tril.T)
    with pytest.raises(AttributeError):
        d.no_such_attribute  # noqa: B018


# --- a field is its argument; everything else is the library's own ---------------

# (wrapper, argument name, the library's own attribute of that name) where the two
# differ: normalised, lower triangle, broadcast, derived.
DIFFERING = {
    "distrax Categorical": (
        lambda: ep.FixedDistrax(distrax.Categorical, probs=jnp.array([1.0, 3.0])),
        "probs",
        jnp.array([0.25, 0.75]),
    ),
    "distrax MultivariateNormalTri": (
        lambda: ep.FixedDistrax(
            distrax.MultivariateNormalTri,
            jnp.zeros(2),
            jnp.array([[1.0, 5.0], [2.0, 3.0]]),
        ),
        "scale_tri",
        jnp.array([[1.0, 0.0], [2.0, 3.0]]),
    ),
    "distrax Normal": (
        lambda: ep.FixedDistrax(distrax.Normal, jnp.zeros(3), 2.0),
        "scale",
        jnp.full(3, 2.0),
    ),
    "tfd Normal": (
        lambda: ep.FixedDistrax(tfd.Normal, jnp.zeros(3), jnp.array([2.0])),
        "scale",
        jnp.array([2.0]),  # (TFP keeps its arguments as given)
    ),
    "numpyro Normal": (
        lambda: ep.FixedDistrax(nd.Normal, jnp.zeros(3), 2.0),
        "scale",
        jnp.array([2.0]),  # (numpyro promotes it to the batch's rank)
    ),
    "numpyro NegativeBinomial2": (
        lambda: ep.FixedDistrax(
            nd.NegativeBinomial2, jnp.array([2.0, 4.0]), jnp.array(3.0)
        ),
        "concentration",
        jnp.array(3.0),
    ),
}


class _Holder(eqx.Module):
    inner: list


def _deep(where, depth):
    """`where` reached through `depth` nested helper calls."""
    return where if depth == 0 else lambda tree: _deep(where, depth - 1)(tree)


@pytest.mark.parametrize("case", list(DIFFERING))
def test_a_field_is_its_argument_in_every_context(case):
    make, name, library = DIFFERING[case]
    d = make()
    given = d.arguments[name]
    same = lambda a: np.testing.assert_array_equal(np.asarray(a), given)  # noqa: E731
    assert getattr(d, name) is given  # eagerly
    _close(getattr(d.instantiate(), name), library)  # the library's own
    same(jax.jit(lambda d: getattr(d, name))(d))
    same(eqx.filter_jit(lambda d: getattr(d, name))(d))
    stacked = jtu.tree_map(lambda x: jnp.stack([x, x]), d)
    mapped = jax.vmap(lambda d: getattr(d, name))(stacked)
    np.testing.assert_array_equal(mapped, jnp.stack([given, given]))
    grads = eqx.filter_grad(lambda d: jnp.sum(getattr(d, name) ** 2))(d)
    _close(getattr(grads, name), 2 * given)  # d(argument²)/d(argument)
    # In `eqx.tree_at`, through 20 helper calls, nested in a module and a list.
    model = _Holder([{"d": d}])
    where = _deep(lambda m: getattr(m.inner[0]["d"], name), 20)
    moved = eqx.tree_at(where, model, given + 1)
    same(getattr(moved.inner[0]["d"], name) - 1)
    twice = eqx.tree_at(where, model, replace_fn=lambda x: 2 * x)  # the argument
    same(getattr(twice.inner[0]["d"], name) / 2)
    # After `tree_at` put a non-array in another field: still the argument.
    for other in [n for n, v in d.arguments.items() if n != name and eqx.is_array(v)]:
        listed = eqx.tree_at(lambda d, o=other: getattr(d, o), d, [0.0, 0.0])
        assert getattr(listed, other) == [0.0, 0.0] and getattr(listed, name) is given
    # A partitioned wrapper (that cannot be built) reads its fields as stored.
    arrays, rest = eqx.partition(d, eqx.is_array)
    assert getattr(arrays, name) is given and getattr(rest, name) is None


def test_everything_else_is_the_librarys_own_kind():
    loc, scale = jnp.array([0.1, 0.4]), jnp.array([1.0, 2.0])
    numpyro_d, raw = ep.FixedDistrax(nd.Normal, loc, scale), nd.Normal(loc, scale)
    distrax_d = ep.FixedDistrax(distrax.Normal, loc, scale)
    # numpyro's properties are values, under jit too; distrax's methods are calls.
    for attr in ("mean", "variance", "batch_shape", "event_shape"):
        _close(getattr(numpyro_d, attr), getattr(raw, attr))
    _close(eqx.filter_jit(lambda d: d.mean + d.variance)(numpyro_d), loc + scale**2)
    assert numpyro_d.support is raw.support
    _close(distrax_d.mean(), loc)
    _close(eqx.filter_jit(distrax_d.variance)(), scale**2)  # a bound method, a PyTree
    # An argument given as None is the attribute; one left out is the library's.
    tril = jnp.array([[1.0, 0.0], [0.5, 2.0]])
    given = ep.FixedDistrax(nd.MultivariateNormal, jnp.zeros(2), None, None, tril)
    assert given.covariance_matrix is None
    left_out = ep.FixedDistrax(nd.MultivariateNormal, jnp.zeros(2), scale_tril=tril)
    _close(left_out.covariance_matrix, tril @ tril.T)
    # An argument named like a uniform attribute is the argument (distrax's
    # Categorical `dtype`); the uniform one stays reachable through the class.
    categorical = ep.FixedDistrax(distrax.Categorical, jnp.zeros(3), dtype=int)
    assert categorical.dtype is int
    assert (
        ep.FixedDistrax.dtype.__get__(categorical)
        == distrax.Categorical(jnp.zeros(3), dtype=int).dtype
    )


def test_python_floats_become_trainable_saved_array_leaves():
    # distrax converts floats to arrays itself; so does the wrapper, with a
    # concrete (non-weak) default float dtype, so that they train and are saved.
    d = ep.FixedDistrax(distrax.Normal, 0.0, 1.0)
    leaves = jtu.tree_leaves(d)
    assert [(x.dtype, x.weak_type) for x in leaves] == [(jnp.float32, False)] * 2
    grads = eqx.filter_grad(lambda d: d.log_prob(0.5))(d)
    _close(grads.loc, 0.5)  # d/dloc log N(0.5; loc, 1) = x - loc
    # Deserialising into a skeleton built with other floats restores the values.
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, ep.FixedDistrax(distrax.Normal, 0.25, 2.0))
    buffer.seek(0)
    loaded = eqx.tree_deserialise_leaves(buffer, d)
    assert (float(loaded.loc), float(loaded.scale)) == (0.25, 2.0)
    _close(loaded.log_prob(0.5), distrax.Normal(0.25, 2.0).log_prob(0.5))


def test_float_leaves_compile_once_and_other_static_values_by_type():
    traces = []

    @jax.jit
    def f(d):
        traces.append(None)
        return d.log_prob(0.5)

    f(ep.FixedDistrax(distrax.Normal, 0.0, 1.0))
    _close(
        f(ep.FixedDistrax(distrax.Normal, 0.0, 2.0)),
        distrax.Normal(0.0, 2.0).log_prob(0.5),
    )
    assert len(traces) == 1  # a new float value is a new leaf value, not a retrace
    # `1` and `True` are equal in Python but not the same static argument.
    i = ep.FixedDistrax(distrax.Independent, ep.FixedDistrax(distrax.Normal, X, X), 1)
    b = ep.FixedDistrax(
        distrax.Independent, ep.FixedDistrax(distrax.Normal, X, X), True
    )
    assert jtu.tree_structure(i) != jtu.tree_structure(b)


def test_static_floats_zero_and_negative_zero_compile_separately():
    # The few floats a class branches on stay static; `0.0 == -0.0` in Python but
    # they must not share a compiled function.
    params = jnp.linspace(-0.5, 0.5, 3 * 13).reshape(3, 13)

    def spline(lo):
        return ep.FixedDistrax(distrax.RationalQuadraticSpline, params, lo, 2.0)

    assert spline(0.0).arguments["range_min"] == 0.0
    assert jtu.tree_structure(spline(0.0)) == jtu.tree_structure(spline(0.0))
    assert jtu.tree_structure(spline(0.0)) != jtu.tree_structure(spline(-0.0))
    assert hash(jtu.tree_structure(spline(0.0))) == hash(
        jtu.tree_structure(spline(0.0))
    )


def test_a_static_argument_is_its_attribute_and_not_a_leaf():
    # As a static field of an Equinox module: read as given, part of the
    # structure, so `eqx.tree_at` refuses it (Equinox's own error); a new wrapper
    # changes it.
    params = jnp.linspace(-0.5, 0.5, 3 * 13).reshape(3, 13)
    spline = ep.FixedDistrax(distrax.RationalQuadraticSpline, params, -2.0, 2.0)
    assert spline.range_min == -2.0 and type(spline.range_min) is float
    with pytest.raises(TypeError, match=r"-2.0 is not a leaf"):
        eqx.tree_at(lambda s: s.range_min, spline, -3.0)
    d = ep.FixedDistrax(distrax.Independent, ep.FixedDistrax(distrax.Normal, X, X), 1)
    assert d.reinterpreted_batch_ndims == 1
    with pytest.raises(TypeError, match=r"1 is not a leaf"):
        eqx.tree_at(lambda d: d.reinterpreted_batch_ndims, d, 2)
    wider = ep.FixedDistrax(distrax.RationalQuadraticSpline, params, -3.0, 2.0)
    with jax.numpy_dtype_promotion("standard"):  # (distrax's spline mixes dtypes)
        raw = distrax.RationalQuadraticSpline(params, -3.0, 2.0)
        _close(wider.forward(X - 2.5), raw.forward(X - 2.5))


def test_integer_arrays_for_continuous_tfp_parameters_are_cast():
    # Raw TFP computes in integers here: log N(0.5; 0, 1) comes out as -0.125.
    d = ep.FixedDistrax(tfd.Normal, jnp.array(0), jnp.array(1))
    assert d.loc.dtype == jnp.float32 and d.scale.dtype == jnp.float32
    _close(d.log_prob(0.5), tfd.Normal(0.0, 1.0).log_prob(0.5))
    _close(d.log_prob(0.5), -1.0439385)
    # Cast to the dtype of the other float arguments ...
    half = ep.FixedDistrax(tfd.Normal, jnp.array(0), jnp.ones((), jnp.bfloat16))
    assert half.loc.dtype == jnp.bfloat16
    # ... but integer parameters stay integers.
    permute = ep.FixedDistrax(tfb.Permute, jnp.array([2, 0, 1]))
    assert permute.permutation.dtype == jnp.int32
    np.testing.assert_array_equal(permute.forward(X), X[jnp.array([2, 0, 1])])
    # Where TFP itself rejects mixed dtypes, the error names the class.
    with pytest.raises(TypeError, match=r"tfd.Binomial rejected.*incompatible dtypes"):
        ep.FixedDistrax(tfd.Binomial, jnp.array(5), logits=jnp.array(0.0))


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (
            distrax.Normal,
            {"mu": X, "scale": X},
            "'mu'; distrax.Normal takes loc, scale",
        ),
        (tfd.Normal, {"sigma": X, "loc": X}, "'sigma'; tfd.Normal takes loc, scale"),
        (nd.Normal, {"mu": X}, "'mu'; numpyro.Normal takes loc, scale"),
    ],
    ids=["distrax", "tfp", "numpyro"],
)
def test_an_unknown_keyword_is_named(cls, kwargs, message):
    with pytest.raises(TypeError, match="unexpected keyword argument " + message):
        ep.FixedDistrax(cls, **kwargs)


def test_spec_builds_in_axes_without_calling_the_class():
    locs = jnp.array([0.0, 1.0, 2.0])
    batched = ep.FixedDistrax(distrax.Normal, locs, jnp.array(1.5))
    in_axes = ep.FixedDistrax.spec(distrax.Normal, 0, None)
    got = jax.vmap(lambda d: d.log_prob(0.3), in_axes=(in_axes,))(batched)
    _close(got, distrax.Normal(locs, 1.5).log_prob(0.3))
    # Nested, with a static argument given by value, and as `out_axes`.
    inner = ep.FixedDistrax.spec(tfd.Normal, loc=0, scale=None)
    spec = ep.FixedDistrax.spec(
        tfd.Independent, inner, static_arguments={"reinterpreted_batch_ndims": 1}
    )
    out = jax.vmap(
        lambda m: ep.FixedDistrax(
            tfd.Independent, ep.FixedDistrax(tfd.Normal, m, jnp.ones(2)), 1
        ),
        out_axes=spec,
    )(jnp.ones((3, 2)))
    assert out.distribution.loc.shape == (3, 2) and out.distribution.scale.shape == (2,)
    with pytest.raises((TypeError, ValueError), match=r"FixedDistrax.spec\(Normal"):
        ep.FixedDistrax(distrax.Normal, 0, None)
    with pytest.raises(TypeError, match=r"spec\(Normal\): too many positional"):
        ep.FixedDistrax.spec(distrax.Normal, 0, None, 1)


def _conditional(z):
    return tfd.Normal(z, 2.0)


def test_static_values_mixed_with_wrappers_in_a_list():
    # A list holding a wrapper and a callable: the callable stays static (not a
    # leaf), the wrapper's arrays are leaves, and `arguments` shows the list.
    model = ep.FixedDistrax(
        tfd.JointDistributionSequential,
        [ep.FixedDistrax(tfd.Normal, jnp.array(0.5), jnp.array(1.5)), _conditional],
    )
    assert len(jtu.tree_leaves(model)) == 2
    assert model.arguments["model"][1] is _conditional
    raw = tfd.JointDistributionSequential([tfd.Normal(0.5, 1.5), _conditional])
    value = [jnp.array(0.3), jnp.array(-0.4)]
    _close(model.log_prob(value), raw.log_prob(value))
    again = ep.FixedDistrax(
        tfd.JointDistributionSequential,
        [ep.FixedDistrax(tfd.Normal, jnp.array(1.0), jnp.array(1.0)), _conditional],
    )
    assert jtu.tree_structure(again) == jtu.tree_structure(model)
    grads = eqx.filter_grad(lambda m: m.log_prob(value))(model)
    _close(grads.model[0].loc, (0.3 - 0.5) / 1.5**2)


def test_vmapped_construction_equals_a_loop():
    locs = jnp.array([0.0, 1.0, 2.0])
    batched = jax.vmap(lambda m: ep.FixedDistrax(distrax.Normal, m, jnp.array(1.5)))(
        locs
    )
    got = jax.vmap(lambda d: d.log_prob(0.3))(batched)
    expected = [distrax.Normal(m, 1.5).log_prob(0.3) for m in locs]
    _close(got, jnp.stack(expected))


# --- one method set for distrax and TFP --------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: tfb.Softplus(hinge_softness=jnp.array(0.7)),
        lambda: tfb.Chain([tfb.Shift(jnp.array(1.0)), tfb.Exp()]),
        lambda: distrax.ScalarAffine(jnp.array(1.0), jnp.array(2.0)),
    ],
    ids=["tfb.Softplus", "tfb.Chain", "distrax.ScalarAffine"],
)
def test_bijector_methods_agree_with_forward_and_log_det(make):
    raw = make()
    cls = type(raw)
    if cls is tfb.Chain:
        b = ep.FixedDistrax(
            tfb.Chain,
            [ep.FixedDistrax(tfb.Shift, jnp.array(1.0)), ep.FixedDistrax(tfb.Exp)],
        )
    elif cls is tfb.Softplus:
        b = ep.FixedDistrax(tfb.Softplus, hinge_softness=jnp.array(0.7))
    else:
        b = ep.FixedDistrax(distrax.ScalarAffine, jnp.array(1.0), jnp.array(2.0))
    y, ldj = b.forward_and_log_det(X)
    _close(y, raw.forward(X))
    _close(ldj, raw.forward_log_det_jacobian(X))
    _close(b(X), y)
    x, ildj = b.inverse_and_log_det(y)
    _close(x, X, rtol=1e-5)
    _close(ildj, raw.inverse_log_det_jacobian(y))
    _close(b.inverse_log_det_jacobian(y), -ldj, rtol=1e-5)


@pytest.mark.parametrize(
    "cls, args",
    [
        (distrax.Normal, (jnp.zeros(3), jnp.ones(3))),
        (tfd.Normal, (jnp.zeros(3), jnp.ones(3))),
        (distrax.MultivariateNormalTri, (jnp.zeros(3), 2 * jnp.eye(3))),
        (distrax.Categorical, (jnp.array([0.1, 0.5, 0.2]),)),
        (tfd.Gamma, (jnp.array([1.5, 2.0]), jnp.array([1.0, 3.0]))),
    ],
    ids=["Normal", "tfd.Normal", "MultivariateNormalTri", "Categorical", "tfd.Gamma"],
)
def test_samples_equal_raw_samples_with_the_same_seed(cls, args):
    wrapped = ep.FixedDistrax(cls, *args)
    got = wrapped.sample(seed=KEY, sample_shape=(2, 5))
    assert got.shape == (2, 5, *wrapped.batch_shape, *wrapped.event_shape)
    np.testing.assert_array_equal(got, cls(*args).sample(seed=KEY, sample_shape=(2, 5)))
    again = wrapped.sample(seed=KEY, sample_shape=(2, 5))
    np.testing.assert_array_equal(got, again)


def test_sample_and_log_prob_on_tfp_and_distrax():
    for cls in (distrax.Normal, tfd.Normal):
        d = ep.FixedDistrax(cls, jnp.zeros(3), jnp.ones(3))
        samples, log_prob = d.sample_and_log_prob(seed=KEY, sample_shape=(4,))
        assert samples.shape == (4, 3)
        _close(log_prob, cls(jnp.zeros(3), jnp.ones(3)).log_prob(samples))


def test_shapes_are_tuples_for_tfp():
    d = ep.FixedDistrax(tfd.MultivariateNormalDiag, jnp.zeros((2, 3)), jnp.ones((2, 3)))
    assert d.batch_shape == (2,) and type(d.batch_shape) is tuple
    assert d.event_shape == (3,) and type(d.event_shape) is tuple


def test_moments_cdf_and_entropy_match_raw():
    loc, scale = jnp.array([0.1, 0.4]), jnp.array([1.0, 2.0])
    for cls in (distrax.Normal, tfd.Normal):
        d, raw = ep.FixedDistrax(cls, loc, scale), cls(loc, scale)
        for method in ("mean", "mode", "variance", "stddev", "entropy"):
            _close(getattr(d, method)(), getattr(raw, method)())
        for method in ("cdf", "log_cdf", "prob", "log_prob"):
            _close(getattr(d, method)(0.3), getattr(raw, method)(0.3))
        assert d.dtype == raw.dtype


@pytest.mark.parametrize("other_cls", [distrax.Normal, tfd.Normal])
def test_kl_divergence_and_cross_entropy_accept_wrapped_other(other_cls):
    p = ep.FixedDistrax(distrax.Normal, jnp.array(0.0), jnp.array(1.0))
    q = ep.FixedDistrax(other_cls, jnp.array(1.0), jnp.array(2.0))
    # Closed form KL(N(0,1) || N(1,2)) = log(2) + (1 + 1) / (2 * 4) - 1/2.
    _close(p.kl_divergence(q), jnp.log(2.0) + 2.0 / 8.0 - 0.5)
    _close(p.kl_divergence(q.instantiate()), p.kl_divergence(q))
    _close(p.cross_entropy(q), p.kl_divergence(q) + p.entropy())
    grads = eqx.filter_grad(lambda q: p.kl_divergence(q))(q)
    # d/dloc_q KL = (loc_q - loc_p) / scale_q^2 = 1 / 4.
    _close(grads.loc, 0.25)


def test_family_specific_methods_raise_clearly():
    d = ep.FixedDistrax(distrax.Normal, jnp.array(0.0), jnp.array(1.0))
    with pytest.raises(TypeError, match=r"Normal\) wraps a distribution; `forward`"):
        d.forward(X)
    b = ep.FixedDistrax(tfb.Exp)
    with pytest.raises(TypeError, match=r"Exp\) wraps a bijector; `sample`"):
        b.sample(seed=KEY)
    # Not a uniform method: the library's own, which a bijector lacks.
    with pytest.raises(AttributeError, match=r"tfb.Exp has no attribute `log_prob`"):
        b.log_prob(X)


def test_scan_then_eager_does_not_leak_tfp_cache_tracers():
    # TFP caches bijector results globally, keyed by input and parameters; a call
    # traced in `scan` must not leave tracers behind for a later eager call.
    d = ep.FixedDistrax(tfd.LogNormal, jnp.array([0.2, 0.5]), jnp.array([1.0, 1.3]))
    x = jnp.array([0.7, 1.9])
    _, traced = jax.lax.scan(lambda c, _: (c, c.log_prob(x)), d, None, length=2)
    eager = d.log_prob(x)
    _close(traced[0], eager)
    _close(
        eager, tfd.LogNormal(jnp.array([0.2, 0.5]), jnp.array([1.0, 1.3])).log_prob(x)
    )


# --- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, match",
    [
        (
            int,
            r"distribution or bijector class as its first argument, got <class 'int'>",
        ),
        (distrax.Normal(0.0, 1.0), r"got an instance of Normal"),
        (distrax.Distribution, r"distrax.Distribution is abstract"),
        (distrax.Linear, r"distrax.Linear is abstract"),
        (tfd.Distribution, r"tfd.Distribution is abstract"),
        (distrax.HMM, r"got <class '.*HMM'>"),
    ],
    ids=[
        "int",
        "instance",
        "distrax.Distribution",
        "distrax.Linear",
        "tfd.Distribution",
        "HMM",
    ],
)
def test_rejects_what_is_not_a_distribution_or_bijector_class(cls, match):
    with pytest.raises(TypeError, match=match):
        ep.FixedDistrax(cls)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: ep.FixedDistrax(distrax.Normal, jnp.zeros(3)),
            TypeError,
            r"FixedDistrax\(Normal\): missing a required argument: 'scale'",
        ),
        (
            lambda: ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(3), sigma=1),
            TypeError,
            r"FixedDistrax\(Normal\): got an unexpected keyword argument 'sigma'",
        ),
        (
            lambda: ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(2)),
            ValueError,
            r"FixedDistrax\(Normal\): distrax.Normal rejected the arguments "
            r"\(loc=f32\[3\], scale=f32\[2\]\)",
        ),
        (
            lambda: ep.FixedDistrax(tfd.Normal, jnp.zeros(3), jnp.ones(2)),
            ValueError,
            r"tfd.Normal rejected the arguments .*`loc` and `scale`",
        ),
        (
            lambda: ep.FixedDistrax(
                distrax.MultivariateNormalTri, jnp.zeros(3), jnp.eye(2)
            ),
            ValueError,
            r"distrax.MultivariateNormalTri rejected the arguments",
        ),
        (
            lambda: ep.FixedDistrax(distrax.Independent, distrax.Normal(0.0, 1.0)),
            TypeError,
            r"argument `distribution` is a raw distrax.Normal instance.*"
            r"FixedDistrax\(distrax.Normal, ...\)",
        ),
        (
            lambda: ep.FixedDistrax(distrax.Chain, [tfb.Exp()]),
            TypeError,
            r"argument `bijectors` is a raw tfb.Exp instance",
        ),
        (
            lambda: ep.FixedDistrax(tfd.Normal, jnp.zeros(2), jnp.ones(2), name={"a"}),
            TypeError,
            r"argument `name` of type set is neither an array nor hashable",
        ),
    ],
    ids=[
        "missing",
        "unexpected",
        "distrax-shapes",
        "tfp-shapes",
        "mvn-shapes",
        "raw-nested",
        "raw-in-list",
        "unhashable",
    ],
)
def test_rejected_arguments_name_the_class_and_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


# --- zero overhead after jit ----------------------------------------------


@pytest.mark.parametrize(
    "cls, args",
    [
        (distrax.Normal, (jnp.zeros(4), jnp.ones(4))),
        (distrax.MultivariateNormalTri, (jnp.zeros(4), jnp.eye(4))),
        (tfd.MultivariateNormalTriL, (jnp.zeros(4), jnp.eye(4))),
        # TFP bijector-based: the fresh array references must compile away.
        (tfd.LogNormal, (jnp.zeros(4), jnp.ones(4))),
        (nd.Normal, (jnp.zeros(4), jnp.ones(4))),
        (nd.MultivariateNormal, (jnp.zeros(4), None, None, jnp.eye(4))),
    ],
    ids=[
        "Normal",
        "MultivariateNormalTri",
        "tfd.MultivariateNormalTriL",
        "tfd.LogNormal",
        "nd.Normal",
        "nd.MultivariateNormal",
    ],
)
def test_compiled_log_prob_has_the_same_hlo_as_raw(cls, args):
    x = jnp.linspace(-1.0, 1.0, 4)
    wrapped = ep.FixedDistrax(cls, *args)
    raw_ops = hlo_op_count(lambda a, x: cls(*a).log_prob(x), args, x)
    assert hlo_op_count(lambda w, x: w.log_prob(x), wrapped, x) == raw_ops


def test_a_bound_method_is_a_pytree_that_jit_traces_once_for_equal_structures():
    # `d.log_prob` carries its wrapper as a leaf: two wrappers with different arrays
    # share one compiled program and each gets its own values (not baked constants).
    first = ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(3))
    second = ep.FixedDistrax(distrax.Normal, jnp.ones(3), 2.0 * jnp.ones(3))
    apply = eqx.filter_jit(lambda method, x: method(x))
    expected = [distrax.Normal(d.loc, d.scale).log_prob(0.5) for d in (first, second)]
    for jitted in (
        lambda d: functools.partial(apply, d.log_prob),
        lambda d: eqx.filter_jit(d.log_prob),
    ):
        with Compilations() as compiled:
            values = [jitted(d)(0.5) for d in (first, second, first)]
        assert compiled.count == 1
        for value, reference in zip(values, expected + expected[:1]):
            _close(value, reference)
    for d in (first, second):
        _close(jax.jit(d.log_prob)(0.5), distrax.Normal(d.loc, d.scale).log_prob(0.5))
    bijector = ep.FixedDistrax(distrax.ScalarAffine, jnp.array(1.0), jnp.array(2.0))
    assert float(jax.jit(bijector.forward)(jnp.array(1.0))) == 3.0
    assert float(eqx.filter_jit(lambda b, x: b(x))(bijector, jnp.array(1.0))) == 3.0


@pytest.mark.parametrize(
    "cls", [distrax.Normal, tfp.distributions.Normal], ids=["distrax", "tfd"]
)
def test_slicing_is_the_librarys_own_and_returns_a_wrapper(cls):
    loc, scale = jnp.arange(4.0), jnp.linspace(1.0, 2.0, 4)
    d, raw = ep.FixedDistrax(cls, loc, scale), cls(loc, scale)
    x = jnp.array(0.5)
    indices = (slice(1, None), slice(None, None, 2), 2, (None, slice(1, 3)))
    for index in (*indices, slice(5, None), jnp.array([0, 2]), Ellipsis):
        sliced = d[index]
        assert isinstance(sliced, ep.FixedDistrax) and sliced.batch_shape == tuple(
            raw[index].batch_shape
        )
        _close(sliced.log_prob(x), raw[index].log_prob(x))
    _close(jax.jit(lambda d: d[1:].log_prob(x))(d), raw[1:].log_prob(x))
    grads = eqx.filter_grad(lambda d: d[1:].log_prob(x).sum())(d)
    _close(grads.loc, jax.grad(lambda m: cls(m, scale)[1:].log_prob(x).sum())(loc))


def test_a_slice_that_cannot_be_wrapped_faithfully_is_an_error_in_every_context():
    # distrax's Softmax keeps `logits / temperature` under the name `logits`, its
    # Categorical normalised logits: a slice rebuilt from those attributes would
    # not be the library's. Whatever the index, eagerly and under jit and grad:
    # a TypeError naming the raw way (it was raw for some indices, a wrapper for
    # others).
    logits = jnp.array([[0.1, 0.5, -1.0], [1.0, 2.0, 3.0], [0.0, -2.0, 1.0]])
    probs = jax.nn.softmax(logits)
    pairs = [
        (ep.FixedDistrax(distrax.Softmax, logits, 0.5), distrax.Softmax(logits, 0.5)),
        (
            ep.FixedDistrax(distrax.Categorical, probs=probs),
            distrax.Categorical(probs=probs),
        ),
    ]
    x = jnp.array([0, 2])
    for d, raw in pairs:
        for index in (2, slice(1, 3), slice(None, -1), (..., -1)):
            with pytest.raises(TypeError, match=r"d\.instantiate\(\)\["):
                d[index]
        with pytest.raises(TypeError, match="faithfully"):
            jax.jit(lambda d: d[1:].log_prob(x))(d)
        with pytest.raises(TypeError, match="faithfully"):
            eqx.filter_grad(lambda d: d[1:].log_prob(x).sum())(d)
        # The way out the message names gives the library's numbers.
        _close(d.instantiate()[1:].log_prob(x), raw[1:].log_prob(x))
    # `from_instance` refuses the same under jit, and accepts a class that keeps
    # its arguments as given, traced or not.
    softmax = lambda z: distrax.Softmax(z, 0.5)  # noqa: E731
    with pytest.raises(TypeError, match="faithfully"):
        jax.jit(lambda z: ep.FixedDistrax.from_instance(softmax(z)))(logits)
    normal = lambda m: distrax.Normal(m, jnp.ones(3))  # noqa: E731
    rebuilt = jax.jit(lambda m: ep.FixedDistrax.from_instance(normal(m)).log_prob(m))
    _close(rebuilt(logits[0]), normal(logits[0]).log_prob(logits[0]))


def test_a_sliced_wrapper_nests_like_any_wrapper():
    # A slice is a wrapper for every index kind, so it nests (a raw slice was
    # refused as an argument).
    loc, scale = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    independent = {distrax.Normal: distrax.Independent, tfd.Normal: tfd.Independent}
    for cls, outer in independent.items():
        d = ep.FixedDistrax(cls, loc, scale)
        for index in (1, slice(None, 1), (slice(None), slice(None, -1)), (..., -1)):
            sliced = d[index]
            assert isinstance(sliced, ep.FixedDistrax)
            event = ep.FixedDistrax(outer, sliced, 1)
            x = jnp.zeros(sliced.batch_shape)
            _close(event.log_prob(x), cls(loc, scale)[index].log_prob(x).sum(-1))


@pytest.mark.parametrize(
    "cls", [distrax.Normal, tfd.Normal, nd.Normal], ids=["distrax", "tfd", "numpyro"]
)
def test_a_wrapper_is_not_iterable(cls):
    # (With `__getitem__` alone Python would iterate by index: without end for
    # TFP, which clamps indices.)
    d = ep.FixedDistrax(cls, jnp.arange(2.0), jnp.ones(2))
    with pytest.raises(TypeError, match="not iterable"):
        iter(d)


def test_a_call_cannot_replace_the_forwarded_method_by_keyword():
    d = ep.FixedDistrax(distrax.Normal, jnp.zeros(2), jnp.ones(2))
    with pytest.raises(TypeError):
        d.log_prob(0.0, method="cdf")
    with pytest.raises(TypeError):
        d.log_prob(0.0, distribution=False)


def test_slicing_a_class_without_it_names_the_class():
    with pytest.raises(TypeError, match="numpyro.Normal cannot be sliced"):
        ep.FixedDistrax(nd.Normal, jnp.zeros(3), 1.0)[1:]


def test_a_field_replaced_with_a_wrong_shape_names_the_class_and_arguments():
    d = ep.FixedDistrax(nd.MultivariateNormal, jnp.zeros(3), scale_tril=jnp.eye(3))
    bad = eqx.tree_at(lambda d: d.loc, d, jnp.zeros(4))
    with pytest.raises(ValueError, match=r"numpyro.MultivariateNormal cannot be built"):
        bad.log_prob(jnp.zeros(3))
    with pytest.raises(
        ValueError, match=r"loc=f32\[4\], scale_tril=f32\[3,3\].*tree_at"
    ):
        bad.mean()


@pytest.mark.parametrize(
    "other",
    [
        ep.FixedDistrax(distrax.Normal, 1.0, 2.0),
        ep.FixedDistrax(tfd.Normal, 1.0, 2.0),
        tfd.Normal(1.0, 2.0),
    ],
    ids=["distrax", "tfd", "raw tfd"],
)
def test_kl_between_numpyro_and_distrax_or_tfp_says_why_and_the_way_out(other):
    ours = ep.FixedDistrax(nd.Normal, 0.0, 1.0)
    for method in ("kl_divergence", "cross_entropy"):
        with pytest.raises(TypeError, match="numpyro's KL registry.*one library"):
            getattr(ours, method)(other)
    if isinstance(other, ep.FixedDistrax):
        with pytest.raises(TypeError, match="numpyro.Normal"):
            other.kl_divergence(ours)
    # Within numpyro, and between distrax and TFP, KL works as before.
    same = ep.FixedDistrax(nd.Normal, 1.0, 2.0)
    _close(
        ours.kl_divergence(same),
        nd.kl_divergence(nd.Normal(0.0, 1.0), nd.Normal(1.0, 2.0)),
    )


# --- training ----------------------------------------------------------------


def test_optax_loop_on_wrapped_mvn_tri_recovers_data_mean():
    true_mean = np.array([1.0, -2.0, 0.5], np.float32)
    data = true_mean + np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32)
    model = ep.FixedDistrax(distrax.MultivariateNormalTri, jnp.zeros(3), jnp.eye(3))
    optimiser = optax.adam(0.05)
    opt_state = optimiser.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, opt_state):
        grads = eqx.filter_grad(lambda m: -jnp.mean(m.log_prob(data)))(model)
        with jax.numpy_dtype_promotion("standard"):  # optax is not strict-clean
            updates, opt_state = optimiser.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state

    for _ in range(400):
        model, opt_state = step(model, opt_state)
    _close(model.loc, data.mean(axis=0), rtol=0, atol=1e-3)
    # The maximum-likelihood covariance is the biased sample covariance.
    _close(model.covariance(), np.cov(data.T, bias=True), rtol=0, atol=2e-2)


def test_treescope_shows_the_class_and_its_arguments():
    treescope = pytest.importorskip("treescope")
    model = {"dist": ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(3))}
    text = treescope.render_to_text(model)
    assert "Normal(" in text and "loc=" in text and "scale=" in text
    assert "_static" not in text and "FixedDistrax" not in text


# --- validation once per structure ---------------------------------------------


class _CountingNormal(distrax.Normal):
    """A real distrax.Normal that counts its constructions."""

    built = 0

    def __init__(self, loc, scale):
        type(self).built += 1
        super().__init__(loc, scale)


def test_every_build_is_checked_by_building_the_object():
    ep.FixedDistrax(_CountingNormal, jnp.zeros(3), jnp.ones(3))
    _CountingNormal.built = 0
    again = ep.FixedDistrax(_CountingNormal, jnp.ones(3), 2 * jnp.ones(3))
    assert _CountingNormal.built == 1  # no cache: the class checks each build
    np.testing.assert_allclose(
        again.log_prob(jnp.zeros(3)),
        distrax.Normal(jnp.ones(3), 2 * jnp.ones(3)).log_prob(jnp.zeros(3)),
    )


def test_cached_validation_still_rejects_new_bad_shapes_and_bad_values():
    ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(3))
    with pytest.raises(ValueError, match="rejected the arguments"):
        ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(4))
    # numpyro checks values when built, so it is validated every time.
    nd = pytest.importorskip("numpyro.distributions")
    ep.FixedDistrax(nd.Normal, jnp.zeros(()), jnp.ones(()), validate_args=True)
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.Normal, jnp.zeros(()), -jnp.ones(()), validate_args=True)
    # So does TFP with validate_args=True.
    tfd = tfp.distributions
    ep.FixedDistrax(tfd.Normal, jnp.zeros(()), jnp.ones(()), validate_args=True)
    with pytest.raises(Exception, match="scale"):
        ep.FixedDistrax(tfd.Normal, jnp.zeros(()), -jnp.ones(()), validate_args=True)


@pytest.mark.parametrize(
    "value", [0.1, -0.0, 1e-40, 1e-50, 3.4028235e38, float("inf"), float("nan")]
)
@pytest.mark.parametrize("x64", [False, True])
def test_python_floats_become_the_arrays_jnp_asarray_makes(value, x64):
    # All floats of a build are converted together: bit for bit `jnp.asarray`.
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        d = ep.FixedDistrax(distrax.ScalarAffine, value, 2.0)
        for got, given in [(d.shift, value), (d.scale, 2.0)]:
            want = jnp.asarray(given, dtype)
            assert (got.dtype, got.weak_type) == (dtype, False)
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
        nested = ep.FixedDistrax(distrax.Chain, [ep.FixedDistrax(distrax.Tanh)] * 2)
        assert jtu.tree_leaves(nested) == []  # no floats: nothing converted


def test_numpyro_checks_the_values_the_arrays_hold():
    # numpyro checks the stored arrays: the float32 array a float becomes, so a
    # scale that rounds to 0 is rejected (raw numpyro checks the float64 1e-50).
    with pytest.raises(ValueError, match="numpyro.Normal rejected.*invalid scale"):
        ep.FixedDistrax(nd.Normal, 0.0, 1e-50)
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.Normal, jnp.zeros(2), jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="invalid scale"):  # NaN
        ep.FixedDistrax(nd.Normal, 0.0, jnp.array(jnp.nan))
    nested = ep.FixedDistrax(
        nd.TransformedDistribution,
        ep.FixedDistrax(nd.Normal, 0.0, 1.0),
        ep.FixedDistrax(nd.transforms.AffineTransform, 1.0, 2.0),
    )
    raw = nd.TransformedDistribution(
        nd.Normal(0.0, 1.0), nd.transforms.AffineTransform(1.0, 2.0)
    )
    _close(nested.log_prob(0.5), raw.log_prob(0.5))
    d = ep.FixedDistrax(nd.Normal, 0.0, ep.positive(2.0))  # a node: resolved first
    _close(ep.resolve(d).log_prob(0.5), nd.Normal(0.0, 2.0).log_prob(0.5))


def _rejects(build):
    try:
        build()
    except ValueError:
        return True
    return False


SUBNORMAL = {jnp.float32: 1e-40, jnp.float64: 1e-310, jnp.bfloat16: 1e-39}


@pytest.mark.parametrize(
    "cls, args",
    [
        (nd.Normal, lambda s: (jnp.zeros((), s.dtype), s)),
        (nd.Exponential, lambda s: (s,)),
        (nd.LogNormal, lambda s: (jnp.zeros((), s.dtype), s)),
        (nd.Dirichlet, lambda s: (jnp.stack([jnp.ones((), s.dtype), s]),)),
        (
            nd.MultivariateNormal,
            lambda s: (
                jnp.zeros(2, s.dtype),
                None,
                None,
                jnp.array([[1.0, 0.0], [0.5, s]], s.dtype),
            ),
        ),
    ],
    ids=["Normal", "Exponential", "LogNormal", "Dirichlet", "MVN scale_tril"],
)
@pytest.mark.parametrize("dtype", list(SUBNORMAL), ids=lambda d: d.__name__)
def test_numpyro_subnormal_arguments_are_judged_as_the_raw_build_judges(
    cls, args, dtype
):
    # XLA on the CPU reads subnormals as 0 (NumPy does not): the wrapper must
    # accept exactly what numpyro accepts from the same JAX arrays (found by the
    # red team when a NumPy copy was checked instead).
    with jax.enable_x64(dtype is jnp.float64):
        a = args(jnp.asarray(SUBNORMAL[dtype], dtype))
        if _rejects(lambda: cls(*a)):
            with pytest.raises(ValueError, match="rejected"):
                ep.FixedDistrax(cls, *a)
        else:
            ep.FixedDistrax(cls, *a)  # accepted by both


def test_numpyro_simplex_is_checked_with_the_arrays_own_sum():
    """float32 probabilities whose NumPy (pairwise) sum is within numpyro's
    simplex tolerance and whose XLA sum is not: rejected, as raw numpyro does."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.random(int(rng.integers(20, 3000))).astype(np.float32)
        p /= p.sum()
        for k in range(-30, 30):
            q = (p * np.float32(1 + k * 1.2e-7)).astype(np.float32)
            s_np, s_jax = q.sum(), jnp.sum(jnp.asarray(q))
            if abs(s_np - 1) < 1e-6 and not bool(jnp.abs(s_jax - 1) < 1e-6):
                probs = jnp.asarray(q)
                assert _rejects(lambda probs=probs: nd.CategoricalProbs(probs))
                with pytest.raises(ValueError, match="rejected"):
                    ep.FixedDistrax(nd.CategoricalProbs, probs)
                return
    raise AssertionError("no vector that sums differently was found")


def test_a_nested_wrapper_rebuilt_from_leaves_is_checked_again():
    # A nested wrapper checked when built is not value-checked again inside its
    # parent's check; one rebuilt by `tree_at` (never checked) is.
    affine = ep.FixedDistrax(nd.transforms.AffineTransform, 1.0, 2.0)
    normal = ep.FixedDistrax(nd.Normal, 0.0, 1.0)
    bad = eqx.tree_at(lambda d: d.scale, normal, jnp.array(-1.0))
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.TransformedDistribution, bad, affine)
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.Independent, bad, 0)
    # (What marks a checked build is kept off the instance: same treedef.)
    assert jtu.tree_structure(bad) == jtu.tree_structure(normal)
    good = ep.FixedDistrax(nd.TransformedDistribution, normal, affine)
    raw = nd.TransformedDistribution(
        nd.Normal(0.0, 1.0), nd.transforms.AffineTransform(1.0, 2.0)
    )
    _close(good.log_prob(0.5), raw.log_prob(0.5))
    assert good.instantiate().base_dist._validate_args  # calls keep validation


# Nested wrappers whose values may have changed or were never checked (found by
# the second red team): the parent's check must catch them as raw builds do.


def test_nested_numpy_array_mutated_after_check_numpyro():
    # NumPy arrays are stored by reference; the inner wrapper's check happened
    # before the mutation, and the outer's check now builds it without checks.
    loc, scale = np.zeros(2, np.float32), np.ones(2, np.float32)
    inner = ep.FixedDistrax(nd.Normal, loc, scale)
    scale[:] = -1.0
    with pytest.raises(ValueError):  # the reference
        nd.Independent(nd.Normal(loc, scale), 1)
    with pytest.raises(ValueError):
        ep.FixedDistrax(nd.Independent, inner, 1)


def test_nested_numpy_array_mutated_after_check_tfp():
    loc, scale = np.zeros(2, np.float32), np.ones(2, np.float32)
    inner = ep.FixedDistrax(tfd.Normal, loc, scale, validate_args=True)
    scale[:] = -1.0
    with pytest.raises(ValueError):  # the reference
        tfd.Independent(
            tfd.Normal(loc, scale, validate_args=True), 1, validate_args=True
        )
    with pytest.raises(ValueError):
        ep.FixedDistrax(tfd.Independent, inner, 1, validate_args=True)


def test_nested_built_with_numpyro_validation_disabled():
    # The inner wrapper was "checked" while numpyro's validation was off; the
    # outer is built with validation on, where raw numpyro rejects the inner.
    with numpyro.validation_enabled(False):
        inner = ep.FixedDistrax(nd.Normal, jnp.zeros(2), -jnp.ones(2))
    with pytest.raises(ValueError):  # the reference
        nd.Independent(nd.Normal(jnp.zeros(2), -jnp.ones(2)), 1)
    with pytest.raises(ValueError):
        ep.FixedDistrax(nd.Independent, inner, 1)


def test_validated_cache_ignores_value_checking_nested_tfp():
    # The shape-only validation cache is keyed on the outer's family only
    # (tfd.Independent without validate_args), so a nested tfd.Normal with
    # validate_args=True and invalid values, rebuilt from leaves, is never built.
    inner = ep.FixedDistrax(tfd.Normal, jnp.zeros(2), jnp.ones(2), validate_args=True)
    ep.FixedDistrax(tfd.Independent, inner, 1)  # valid: fills the cache
    bad = jax.tree_util.tree_map(lambda x: -x, inner)  # rebuilt: unchecked
    with pytest.raises(ValueError):  # the reference
        tfd.Independent(tfd.Normal(jnp.zeros(2), -jnp.ones(2), validate_args=True), 1)
    with pytest.raises(ValueError):
        ep.FixedDistrax(tfd.Independent, bad, 1)


# --- numpyro's value checks -------------------------------------------------------


def _outcome(build):
    try:
        build()
    except ValueError:
        return "rejected"
    return "accepted"


def test_numpyro_wrappers_accept_what_raw_numpyro_accepts():
    # Every numpyro distribution of the conformance cases, with bad values of
    # each float argument: the wrapper's verdict is raw numpyro's.
    import _cases

    compared = rejected = 0
    for name, case in _cases.NUMPYRO_DISTRIBUTIONS.items():
        for key, x in case.params.items():
            if not jnp.issubdtype(x.dtype, jnp.floating):
                continue
            for bad in (jnp.nan, -jnp.inf, -1.0, 0.0):
                params = case.params | {key: x.at[(0,) * x.ndim].set(bad)}
                make = case.make
                want = _outcome(lambda p=params, m=make: m(p, _cases.RAW))
                got = _outcome(lambda p=params, m=make: m(p, ep.FixedDistrax))
                assert got == want, (name, key, bad)
                compared += 1
                rejected += want == "rejected"
    assert compared > 100 and rejected > 50, (compared, rejected)


def test_numpyro_rejection_names_the_class_and_numpyro_s_reason():
    ep.FixedDistrax(nd.Gumbel, jnp.zeros(8), jnp.ones(8))
    with pytest.raises(ValueError, match="numpyro.Gumbel rejected.*invalid scale"):
        ep.FixedDistrax(nd.Gumbel, jnp.zeros(8), -jnp.ones(8))


def test_numpyro_class_overriding_validate_args_is_checked_eagerly():
    class Bounded(nd.Normal):  # a user's extra check on top of numpyro's
        def validate_args(self, strict=True):
            super().validate_args(strict)
            if not_jax_tracer(self.loc) and np.any(np.asarray(self.loc) > 10):
                raise ValueError("loc above 10")

    from numpyro.util import not_jax_tracer

    Bounded.__module__ = "numpyro.user"  # (the family owns numpyro's modules)

    ep.FixedDistrax(Bounded, jnp.zeros(2), jnp.ones(2))
    with pytest.raises(ValueError, match="loc above 10"):
        Bounded(jnp.full(2, 20.0), jnp.ones(2))  # the reference
    with pytest.raises(ValueError, match="Bounded rejected.*loc above 10"):
        ep.FixedDistrax(Bounded, jnp.full(2, 20.0), jnp.ones(2))


def test_numpyro_class_that_cannot_be_traced_is_checked_eagerly():
    class Concrete(nd.Normal):  # reads a value in `__init__`: fails under `jit`
        def __init__(self, loc, scale, validate_args=None):
            self.scale_was = float(jnp.max(scale))
            super().__init__(loc, scale, validate_args=validate_args)

    Concrete.__module__ = "numpyro.user"

    for _ in range(2):
        d = ep.FixedDistrax(Concrete, jnp.zeros(2), jnp.ones(2))
        _close(d.log_prob(X[:2]), nd.Normal(0.0, 1.0).log_prob(X[:2]))
        with pytest.raises(ValueError, match="Concrete rejected.*invalid scale"):
            ep.FixedDistrax(Concrete, jnp.zeros(2), -jnp.ones(2))


def test_numpyro_check_follows_the_validation_setting():
    bad = (jnp.zeros(2), -jnp.ones(2))
    ep.FixedDistrax(nd.Normal, jnp.zeros(2), jnp.ones(2))  # compiles the check
    with numpyro.validation_enabled(False):
        nd.Normal(*bad)  # raw numpyro accepts it: so does the wrapper
        d = ep.FixedDistrax(nd.Normal, *bad)
        assert np.isnan(d.log_prob(X[:2])).all()
        with pytest.raises(ValueError, match="invalid scale"):
            ep.FixedDistrax(nd.Normal, *bad, validate_args=True)
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.Normal, *bad)
    ep.FixedDistrax(nd.Normal, *bad, validate_args=False)


def test_numpyro_check_under_jit_vmap_disable_jit_and_x64():
    def log_prob(scale):
        return ep.FixedDistrax(nd.Normal, 0.0, scale).log_prob(0.5)

    want = nd.Normal(0.0, 2.0).log_prob(0.5)
    _close(jax.jit(log_prob)(jnp.array(2.0)), want)  # traced: numpyro skips it
    _close(jax.vmap(log_prob)(jnp.array([2.0, 2.0])), jnp.stack([want, want]))
    with jax.disable_jit():
        _close(log_prob(jnp.array(2.0)), want)
        with pytest.raises(ValueError, match="invalid scale"):
            ep.FixedDistrax(nd.Normal, 0.0, jnp.array(-2.0))
    for x64 in (False, True):
        with jax.enable_x64(x64):
            ep.FixedDistrax(nd.Normal, 0.0, jnp.array(2.0))
            with pytest.raises(ValueError, match="invalid scale"):
                ep.FixedDistrax(nd.Normal, 0.0, jnp.array(-2.0))
            with pytest.raises(ValueError, match="invalid scale"):  # weakly typed
                ep.FixedDistrax(nd.Normal, 0.0, jnp.asarray(-2.0))


def test_numpyro_nested_checks_with_lists_of_transforms():
    # A list of transforms (plain wrappers) and an inner distribution checked
    # when built: the outer is checked by the compiled call too, and a rebuilt
    # inner (never checked) by the eager build.
    inner = ep.FixedDistrax(nd.Normal, jnp.zeros(2), jnp.ones(2))
    transforms = [
        ep.FixedDistrax(nd.transforms.AffineTransform, 0.5, 2.0),
        ep.FixedDistrax(nd.transforms.ExpTransform),
    ]
    d = ep.FixedDistrax(nd.TransformedDistribution, inner, transforms)
    raw = nd.TransformedDistribution(
        nd.Normal(jnp.zeros(2), jnp.ones(2)),
        [nd.transforms.AffineTransform(0.5, 2.0), nd.transforms.ExpTransform()],
    )
    _close(d.log_prob(jnp.array([1.5, 2.5])), raw.log_prob(jnp.array([1.5, 2.5])))
    bad = eqx.tree_at(lambda n: n.scale, inner, -jnp.ones(2))
    with pytest.raises(ValueError, match="invalid scale"):
        ep.FixedDistrax(nd.TransformedDistribution, bad, transforms)
    node = ep.FixedDistrax(nd.transforms.AffineTransform, 0.5, ep.positive(2.0))
    resolved = ep.FixedDistrax(nd.TransformedDistribution, inner, [node])
    _close(
        ep.resolve(resolved).log_prob(jnp.array([1.5, 2.5])),
        nd.TransformedDistribution(
            nd.Normal(jnp.zeros(2), jnp.ones(2)),
            [nd.transforms.AffineTransform(0.5, 2.0)],
        ).log_prob(jnp.array([1.5, 2.5])),
    )


@pytest.mark.standard_promotion("numpyro's Wishart/copula/LKJ builds mix dtypes")
@pytest.mark.parametrize(
    "case",
    [
        "Wishart scale_tril",
        "LKJCholesky concentration=1e-10",
        "NegativeBinomialLogits logits=100",
        "RelaxedBernoulliLogits temperature=inf",
    ],
)
def test_numpyro_checks_of_distributions_built_by_init(case):
    # numpyro's `__init__` of these builds another distribution whose own check
    # rejects the arguments (found by the red team: the compiled check first
    # tested the outer object's arguments only, and the wrapper accepted them).
    # All of them are in the family pin test; these through the wrapper.
    import _cases

    cls, good, bad = _cases.NUMPYRO_INNER_CHECKS[case]
    with pytest.raises(ValueError) as raw:  # the reference
        cls(**bad)
    message = re.escape(str(raw.value))
    with pytest.raises(ValueError, match=f"{cls.__name__} rejected.*{message}"):
        ep.FixedDistrax(cls, **bad)
    d = ep.FixedDistrax(cls, **good)
    x = jax.jit(lambda key: cls(**good).sample(key))(KEY)  # (eagerly: seconds)
    want = jax.jit(lambda x: cls(**good).log_prob(x))(x)
    _close(jax.jit(lambda d: d.log_prob(x))(d), want, rtol=1e-4)


@pytest.mark.parametrize(
    "support", [nd.constraints.positive, nd.constraints.real, nd.constraints.simplex]
)
def test_numpyro_improper_uniform_with_an_unhashable_constraint(support):
    # numpyro constraints do not hash; the compiled check is keyed by the static
    # arguments, so this build is checked eagerly (red team: it raised TypeError).
    raw = nd.ImproperUniform(support, (), (2,))
    d = ep.FixedDistrax(nd.ImproperUniform, support, (), (2,))
    x = jnp.array([0.25, 0.75])
    _close(d.log_prob(x), raw.log_prob(x))


@pytest.mark.parametrize("transform", ["jit", "scan"])
def test_numpyro_build_inside_a_transformation(transform):
    # Built from concrete arrays inside a trace: as numpyro builds it there.
    n = {"jit": 13, "scan": 15}[transform]
    loc, scale = jnp.zeros(n), jnp.ones(n)  # concrete, closed over
    ep.FixedDistrax(nd.Laplace, jnp.zeros(2), jnp.ones(2))  # seen once

    def log_prob(x):
        return ep.FixedDistrax(nd.Laplace, loc, scale).log_prob(x)

    x = jnp.zeros(n)
    if transform == "jit":
        got = jax.jit(log_prob)(x)
    else:
        got = jax.lax.scan(lambda c, x: (c, log_prob(x)), 0.0, x[None])[1][0]
    _close(got, nd.Laplace(loc, scale).log_prob(x))
    with pytest.raises(ValueError, match="invalid scale"):  # checked eagerly after
        ep.FixedDistrax(nd.Laplace, jnp.zeros(n), -jnp.ones(n))


@pytest.mark.slow
def test_numpyro_validation_toggled_in_another_thread_leaves_no_stale_check():
    # Red team: the compiled check read numpyro's global setting under its
    # trace, so another thread turning validation off meanwhile left a check
    # that passed anything, cached for good. It no longer reads it: after the
    # toggling, every invalid build is rejected, as raw numpyro rejects it.
    import sys
    import time

    shapes = [(k, 3) for k in range(61, 73)]
    stop = threading.Event()
    was, interval = nd.Distribution._validate_args, sys.getswitchinterval()

    def toggle():
        on = True
        while not stop.is_set():
            on = not on
            numpyro.enable_validation(on)
            time.sleep(0)

    def build():
        for s in shapes:
            try:  # (racy here, as numpyro's own outcome would be)
                ep.FixedDistrax(nd.Normal, jnp.zeros(s), jnp.ones(s))
            except ValueError:
                pass

    sys.setswitchinterval(1e-6)
    toggler, builder = threading.Thread(target=toggle), threading.Thread(target=build)
    try:
        toggler.start()
        builder.start()
        builder.join()
    finally:
        stop.set()
        toggler.join()
        sys.setswitchinterval(interval)
        numpyro.enable_validation(True)
    try:
        for s in shapes:
            loc, bad = jnp.zeros(s), -jnp.ones(s)
            raw = functools.partial(nd.Normal, loc, bad)
            assert _outcome(raw) == "rejected"  # the reference
            got = _outcome(functools.partial(ep.FixedDistrax, nd.Normal, loc, bad))
            assert got == "rejected", s
    finally:
        numpyro.enable_validation(was)


def test_numpyro_nested_transform_that_reads_a_value_when_built():
    # A transform that needs a concrete value when built, nested: as numpyro.
    class Concrete(nd.transforms.AffineTransform):  # reads a value when built
        def __init__(self, loc, scale):
            self.scale_was = float(jnp.max(scale))
            super().__init__(loc, scale)

    Concrete.__module__ = "numpyro.user"  # (the family owns numpyro's modules)

    def transformed(k, transform):
        normal = ep.FixedDistrax(nd.Normal, jnp.zeros(k), jnp.ones(k))
        base = ep.FixedDistrax(nd.Independent, normal, 1)
        return ep.FixedDistrax(nd.TransformedDistribution, base, transform)

    exp = ep.FixedDistrax(nd.transforms.ExpTransform)
    odd = ep.FixedDistrax(Concrete, jnp.array(0.0), jnp.array(2.0))
    for k in (130, 131):  # seen once, then traced
        transformed(k, exp)
        transformed(k, odd)
    x = jnp.array([[0.5, 1.0]])
    raw = nd.TransformedDistribution(
        nd.Independent(nd.Normal(jnp.zeros(2), jnp.ones(2)), 1),
        nd.transforms.AffineTransform(jnp.array(0.0), jnp.array(2.0)),
    )
    _close(transformed(2, odd).log_prob(x), raw.log_prob(x))


def test_numpyro_discrete_cosine_transform_keeps_smooth_a_float():
    # Its `__init__` calls `float(smooth)`: an array there fails under `jax.jit`.
    t = ep.FixedDistrax(nd.transforms.DiscreteCosineTransform, smooth=1.0)
    x = jnp.array([0.3, -0.2, 0.5])
    raw = nd.transforms.DiscreteCosineTransform(smooth=1.0)
    _close(jax.jit(lambda t, x: t.forward(x))(t, x), raw(x))


def test_construction_from_eight_threads_checks_and_binds_like_one_thread():
    # The construction caches (bindings, class checks, marks of checked builds,
    # the shapes-and-dtypes cache) shared by 8 threads at once.
    normal = ep.FixedDistrax(nd.Normal, 0.0, 1.0)
    bad = eqx.tree_at(lambda d: d.scale, normal, jnp.array(-1.0))
    raw = nd.TransformedDistribution(
        nd.Normal(0.5, 2.0), nd.transforms.AffineTransform(1.0, 3.0)
    ).log_prob(0.25)
    barrier = threading.Barrier(8)
    outcomes, errors = [], []

    def work(i):
        try:
            barrier.wait()
            for _ in range(5):
                d = ep.FixedDistrax(
                    nd.TransformedDistribution,
                    ep.FixedDistrax(nd.Normal, 0.5, scale=2.0),
                    ep.FixedDistrax(nd.transforms.AffineTransform, 1.0, 3.0),
                )
                a = ep.FixedDistrax(distrax.ScalarAffine, float(i), scale=2.0)
                try:
                    ep.FixedDistrax(nd.Independent, bad, 0)
                    rejected = False
                except ValueError:
                    rejected = True
                shift, scale = float(a.shift), float(a.scale)
                outcomes.append((float(d.log_prob(0.25)), shift, scale, i, rejected))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(outcomes) == 40
    for log_prob, shift, scale, i, rejected in outcomes:
        np.testing.assert_allclose(log_prob, raw, rtol=1e-6)
        assert (shift, scale, rejected) == (float(i), 2.0, True)


def test_calls_of_one_shape_bind_their_own_values():
    # Bindings are cached per (class, number of positional arguments, keywords).
    x, y = jnp.array(0.5), jnp.array(2.0)
    for _ in range(2):
        a = ep.FixedDistrax(distrax.Normal, x, scale=y)
        b = ep.FixedDistrax(distrax.Normal, scale=x, loc=y)
        assert (a.loc, a.scale, b.loc, b.scale) == (x, y, y, x)
        with pytest.raises(TypeError, match="multiple values"):
            ep.FixedDistrax(distrax.Normal, x, loc=y)
        with pytest.raises(TypeError, match="missing"):
            ep.FixedDistrax(distrax.Normal, x)


def test_integer_arguments_are_validated_every_time():
    # TFP reads integer arguments (shapes, counts) as values when it builds.
    tfd, tfb = tfp.distributions, tfp.bijectors
    normal = ep.FixedDistrax(tfd.Normal, jnp.array(0.0), jnp.array(1.0))
    ep.FixedDistrax(tfd.Sample, normal, jnp.array([3]))
    with pytest.raises(ValueError, match="rejected the arguments"):
        ep.FixedDistrax(tfd.Sample, normal, jnp.array([-3]))
    ep.FixedDistrax(tfb.Reshape, jnp.array([2, 3]))
    with pytest.raises(ValueError, match="rejected the arguments"):
        ep.FixedDistrax(tfb.Reshape, jnp.array([-1, -1]))
