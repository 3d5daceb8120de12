"""The conformance matrix: every case in `_cases.CASES` against every PyTree operation.

The reference is always the raw distrax/TFP/numpyro object built from the same arrays,
called through its own library's API (numpyro: `t(x)`, `log_abs_det_jacobian`,
`sample(key, shape)`).
"""

import functools
import io
import warnings

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import numpyro.distributions as nd
import pytest
from _cases import (
    CASES,
    DISTRAX,
    DISTRAX_NOT_CONSTRUCTIBLE,
    FLOAT64_WARNING_UPSTREAM,
    NOT_STRICT_UPSTREAM,
    NUMPYRO_DISTRIBUTIONS,
    NUMPYRO_TRANSFORMS,
    RAW,
    TFP_BIJECTORS,
    Case,
)
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions
tfb = tfp.bijectors
KEY = jax.random.PRNGKey(0)
NAMES = sorted(CASES)


def _value(obj, case: Case, x):
    """A scalar of the object's main computation, through each library's own API."""
    if case.kind == "dist":
        return sum(jnp.sum(v) for v in jtu.tree_leaves(obj.log_prob(x)))
    if isinstance(obj, nd.transforms.Transform):  # raw numpyro
        y = obj(x)
        return jnp.sum(y) + jnp.sum(obj.log_abs_det_jacobian(x, y))
    return jnp.sum(obj.forward(x)) + jnp.sum(obj.forward_log_det_jacobian(x))


def _raw_sample(obj, key, sample_shape=()):
    if isinstance(obj, nd.Distribution):
        return obj.sample(key, sample_shape)
    return obj.sample(seed=key, sample_shape=sample_shape)


# Compiled once per case and reused across tests: eager TFP is slow op by op.
@functools.cache
def _input(name: str):
    case = CASES[name]
    if case.kind == "bij":
        return case.x
    sample = jax.jit(lambda p: _raw_sample(case.make(p, RAW), jax.random.PRNGKey(42)))
    return sample(case.params)


def _split(params):
    """(float params, the rest): only the former are differentiated."""
    floats = {k: v for k, v in params.items() if eqx.is_inexact_array(v)}
    return floats, {k: v for k, v in params.items() if k not in floats}


# One compilation per case serves every test (value and gradient together).
@functools.cache
def _raw_value_and_grad(name: str):
    """(float params, other params, x) -> value and gradient of the raw object."""
    case = CASES[name]
    return jax.jit(
        jax.value_and_grad(
            lambda floats, others, x: _value(
                case.make({**floats, **others}, RAW), case, x
            )
        )
    )


@functools.cache
def _wrapped_value_and_grad(name: str):
    """(wrapper, x) -> value and `filter_grad` of the wrapper, via `filter_jit`."""
    case = CASES[name]
    return eqx.filter_jit(eqx.filter_value_and_grad(lambda w, x: _value(w, case, x)))


def _reference(name: str, params=None):
    params = CASES[name].params if params is None else params
    return _raw_value_and_grad(name)(*_split(params), _input(name))[0]


def _wrapped_value(name: str, wrapped):
    return _wrapped_value_and_grad(name)(wrapped, _input(name))[0]


def _touch(v):
    """A new array equal to `v`, of the same dtype (also for bool masks)."""
    return v + jnp.zeros((), v.dtype)


def _close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol, atol)


@pytest.fixture(params=NAMES, ids=NAMES)
def name(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _upstream_exceptions(request):
    """Standard promotion for cases whose upstream class is not strict-clean
    (`NOT_STRICT_UPSTREAM`); JAX's float64-truncation warning ignored for those
    that ask for float64 themselves (`FLOAT64_WARNING_UPSTREAM`)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    case = params.get("name")
    promotion = "standard" if case in NOT_STRICT_UPSTREAM else "strict"
    with jax.numpy_dtype_promotion(promotion), warnings.catch_warnings():
        if case in FLOAT64_WARNING_UPSTREAM:
            warnings.filterwarnings(
                "ignore", "Explicitly requested dtype float64", UserWarning
            )
        yield


def test_matrix_covers_distrax_and_enough_tfp_and_numpyro():
    classes = {n for n in distrax.__all__ if isinstance(getattr(distrax, n), type)}
    classes |= {"BijectorLike", "DistributionLike"} & set(distrax.__all__)
    assert classes - set(DISTRAX_NOT_CONSTRUCTIBLE) == set(DISTRAX)
    tfp_dists = [n for n, c in CASES.items() if n.startswith("tfd.")]
    assert len(tfp_dists) >= 20
    assert len(TFP_BIJECTORS) >= 10
    assert len(NUMPYRO_DISTRIBUTIONS) >= 20
    assert len(NUMPYRO_TRANSFORMS) >= 8


def test_leaves_are_exactly_the_array_arguments(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    leaves = jtu.tree_leaves(wrapped)
    assert sorted(map(id, leaves)) == sorted(map(id, case.params.values()))


WITH_FLOATS = [n for n in NAMES if _split(CASES[n].params)[0]]


@pytest.mark.parametrize("name", WITH_FLOATS)
def test_filter_grad_matches_raw_grad(name):
    case, x = CASES[name], _input(name)
    floats, others = _split(case.params)
    expected = _raw_value_and_grad(name)(floats, others, x)[1]
    wrapped = case.make(case.params, ep.FixedDistrax)
    grads = _wrapped_value_and_grad(name)(wrapped, x)[1]
    # Leaves of `grads` sit where the corresponding parameters sit in `wrapped`.
    name_of = {id(v): k for k, v in case.params.items()}
    got = {
        name_of[id(p)]: g
        for p, g in zip(
            jtu.tree_leaves(wrapped),
            jtu.tree_leaves(grads, is_leaf=lambda g: g is None),
        )
        if name_of[id(p)] in floats
    }
    assert set(got) == set(expected)
    for k in expected:
        _close(got[k], expected[k], rtol=1e-4, atol=1e-5)


def test_partition_combine_round_trip(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    dynamic, static = eqx.partition(wrapped, eqx.is_array)
    assert jtu.tree_leaves(static) == []
    again = eqx.combine(dynamic, static)
    assert jtu.tree_structure(again) == jtu.tree_structure(wrapped)
    _close(_wrapped_value(name, again), _reference(name), rtol=1e-4)


def test_tree_map_keeps_structure(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    copied = jtu.tree_map(_touch, wrapped)
    assert jtu.tree_structure(copied) == jtu.tree_structure(wrapped)
    assert repr(copied) == repr(wrapped)


def _first_array_where(obj):
    """A where-function selecting the first array argument, found by name."""
    for arg, value in obj.arguments.items():
        if eqx.is_array(value):
            return lambda o: getattr(o, arg)
        if isinstance(value, ep.FixedDistrax):
            inner = _first_array_where(value)
            if inner is not None:
                return lambda o: inner(getattr(o, arg))
    return None


class _Arguments:
    """A wrapper's arguments read as attributes (nested wrappers too)."""

    def __init__(self, wrapper):
        self.wrapper = wrapper

    def __getattr__(self, name):
        value = self.wrapper.arguments[name]
        return _Arguments(value) if isinstance(value, ep.FixedDistrax) else value


def _has_array_argument(name: str) -> bool:
    promotion = "standard" if name in NOT_STRICT_UPSTREAM else "strict"
    with jax.numpy_dtype_promotion(promotion):
        wrapped = CASES[name].make(CASES[name].params, ep.FixedDistrax)
    return _first_array_where(wrapped) is not None


WITH_ARRAYS = [n for n in NAMES if _has_array_argument(n)]


@pytest.mark.parametrize("name", WITH_ARRAYS)
def test_tree_at_on_a_parameter(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    where = _first_array_where(wrapped)
    assert where is not None  # (`WITH_ARRAYS`)
    old = where(_Arguments(wrapped))  # (the argument as given; `d.x` may refuse)
    new_value = _touch(old) if old.dtype == bool else old * 1.01
    updated = eqx.tree_at(where, wrapped, new_value)
    assert where(_Arguments(updated)) is new_value
    # Reference: the raw object built with the same substitution in the params.
    key = next(k for k, v in case.params.items() if v is old)
    expected = _reference(name, {**case.params, key: new_value})
    _close(_wrapped_value(name, updated), expected, rtol=1e-4)


def test_plain_jit_compiles_once_for_equal_wrappers(name):
    case, x = CASES[name], _input(name)
    traces = []

    @jax.jit
    def f(w, x):
        traces.append(None)
        return _value(w, case, x)

    _close(f(case.make(case.params, ep.FixedDistrax), x), _reference(name), rtol=1e-4)
    fresh = {k: jnp.array(v) for k, v in case.params.items()}
    f(case.make(fresh, ep.FixedDistrax), x)
    assert len(traces) == 1


def _scaled(params, factor):
    return {
        k: v * factor if eqx.is_inexact_array(v) and k not in ("lo", "hi") else v
        for k, v in params.items()
    }


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].params])
def test_vmap_over_stacked_wrappers_equals_loop(name):
    case, x = CASES[name], _input(name)
    factors = (1.0, 1.05, 1.1)
    wrappers = [case.make(_scaled(case.params, f), ep.FixedDistrax) for f in factors]
    stacked = jtu.tree_map(lambda *v: jnp.stack(v), *wrappers)
    got = jax.jit(jax.vmap(lambda w: _value(w, case, x)))(stacked)
    expected = [_reference(name, _scaled(case.params, f)) for f in factors]
    _close(got, jnp.stack(expected), rtol=1e-4)


def test_scan_carry(name):
    case, x = CASES[name], _input(name)
    wrapped = case.make(case.params, ep.FixedDistrax)

    def step(carry, _):
        carry = jtu.tree_map(_touch, carry)
        return carry, _value(carry, case, x)

    final, values = jax.lax.scan(step, wrapped, None, length=3)
    assert jtu.tree_structure(final) == jtu.tree_structure(wrapped)
    _close(values, jnp.stack([_reference(name)] * 3), rtol=1e-4)


def test_serialisation_round_trip_is_bit_exact(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, wrapped)
    buffer.seek(0)
    like = jtu.tree_map(jnp.zeros_like, wrapped)
    loaded = eqx.tree_deserialise_leaves(buffer, like)
    assert jtu.tree_structure(loaded) == jtu.tree_structure(wrapped)
    for before, after in zip(jtu.tree_leaves(wrapped), jtu.tree_leaves(loaded)):
        assert before.dtype == after.dtype
        np.testing.assert_array_equal(np.asarray(before), np.asarray(after))


@pytest.mark.parametrize("name", [n for n in NAMES if CASES[n].kind == "dist"])
def test_sample_shapes_and_dtypes_match_raw(name):
    # Shapes only, via `jax.eval_shape`: compiling samplers (gamma-based ones take
    # seconds) for ~70 classes would dominate the suite. Values are compared with
    # raw samples for a few classes in test_wrappers.py.
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    got = jax.eval_shape(lambda w: w.sample(seed=KEY, sample_shape=(2,)), wrapped)
    expected = jax.eval_shape(
        lambda p: _raw_sample(case.make(p, RAW), KEY, (2,)), case.params
    )
    assert jtu.tree_structure(got) == jtu.tree_structure(expected)
    batch, event = wrapped.batch_shape, wrapped.event_shape
    for g, e, ev in zip(
        jtu.tree_leaves(got),
        jtu.tree_leaves(expected),
        jtu.tree_leaves(event, is_leaf=lambda s: isinstance(s, tuple)),
    ):
        assert g.shape == e.shape == (2, *batch, *ev)
        assert g.dtype == e.dtype


def test_attributes_agree_with_the_raw_object_or_refuse(name):
    """For each array attribute the raw object has, the wrapper's attribute of that
    name equals it (shape included), or, for an argument the library computes its
    attribute of that name from or broadcasts, raises naming `d.arguments[...]`. The
    uniform methods (`mean()`, `sample`, ...) are the wrapper's by design."""
    case = CASES[name]
    wrapped, raw = case.make(case.params, ep.FixedDistrax), case.make(case.params, RAW)
    for attr in dir(raw):
        if attr.startswith("_") or hasattr(ep.FixedDistrax, attr):
            continue
        try:
            expected = getattr(raw, attr)
        except Exception:
            continue
        if not eqx.is_array(expected):
            continue
        try:
            got = getattr(wrapped, attr)
        except TypeError as e:
            assert attr in wrapped.arguments, (attr, e)
            assert f"d.arguments[{attr!r}]" in str(e)
            continue
        assert np.shape(got) == np.shape(expected), attr
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0, err_msg=attr)


def test_attribute_rule_is_the_same_under_jit():
    probs = jnp.array([1.0, 1.0])
    categorical = ep.FixedDistrax(distrax.Categorical, probs=probs)
    normal = ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.array(1.0))

    @jax.jit
    def read(c, n):
        with pytest.raises(TypeError, match=r"d\.arguments\['probs'\]"):
            _ = c.probs
        with pytest.raises(TypeError, match=r"broadcast or reshaped to \(3,\)"):
            _ = n.scale  # (distrax's `scale` has the batch shape)
        return n.loc, c.logits, c.arguments["probs"]

    loc, logits, argument = read(categorical, normal)
    _close(loc, jnp.zeros(3))
    _close(logits, jnp.log(jnp.array([0.5, 0.5])))  # the library's, normalised
    _close(argument, probs)
    with pytest.raises(TypeError, match="computed from the arguments, not the"):
        _ = categorical.probs
    # In `eqx.tree_at`'s where-function the field is the argument, as stored.
    moved = eqx.tree_at(lambda c: c.probs, categorical, jnp.array([1.0, 3.0]))
    _close(moved.instantiate().probs, jnp.array([0.25, 0.75]))
    # numpyro's attributes for an argument given as `None` are numpyro's.
    mvn = ep.FixedDistrax(
        nd.MultivariateNormal, jnp.zeros(2), covariance_matrix=2 * jnp.eye(2),
        precision_matrix=None,
    )  # fmt: skip
    _close(mvn.precision_matrix, 0.5 * jnp.eye(2))
