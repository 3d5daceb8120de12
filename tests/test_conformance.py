"""The conformance matrix: every case in `_cases.CASES` against every PyTree operation.

The reference is always the raw distrax/TFP/numpyro object built from the same arrays,
called through its own library's API (numpyro: `t(x)`, `log_abs_det_jacobian`,
`sample(key, shape)`).
"""

import functools
import inspect
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
    INPUTS,
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


@functools.cache
def _input(name: str):
    """The point every test of the case evaluates at: a bijector case's `x`, a
    point of `_cases.INPUTS` (of the sample's shape and dtype), else a sample of
    the raw distribution (drawn in `_both`'s compiled program)."""
    case = CASES[name]
    if name in INPUTS:
        sample = jax.eval_shape(
            lambda p: _raw_sample(case.make(p, RAW), KEY), case.params
        )
        given = INPUTS[name]
        assert (given.shape, given.dtype) == (sample.shape, sample.dtype), name
    return _both(name)(case.params, case.make(case.params, ep.FixedDistrax))[2]


def _split(params):
    """(float params, the rest): only the former are differentiated."""
    floats = {k: v for k, v in params.items() if eqx.is_inexact_array(v)}
    return floats, {k: v for k, v in params.items() if k not in floats}


# One compilation per case serves every test (eager TFP is slow op by op): the
# input, the raw object's value and `jax.grad` (the reference), and the wrapper's
# value and `filter_grad`, together.
@functools.cache
def _both(name: str):
    """(params, wrapper) -> ((raw value, raw grads), (wrapper's value, grads), x)."""
    case = CASES[name]
    raw = jax.value_and_grad(
        lambda floats, others, x: _value(case.make({**floats, **others}, RAW), case, x)
    )
    wrapped = eqx.filter_value_and_grad(lambda w, x: _value(w, case, x))

    @jax.jit
    def both(floats, others, w, base, x):
        # (`x` an argument: TFP's cache, keyed by the input's identity, must not
        # see one array in two traces.)
        if case.kind == "dist" and name not in INPUTS:  # (from the case's params)
            key = jax.random.PRNGKey(42)
            x = jax.lax.stop_gradient(_raw_sample(case.make(base, RAW), key))
        return raw(floats, others, x), wrapped(w, x), x

    x = INPUTS.get(name, case.x)
    return lambda params, w: both(*_split(params), w, case.params, x)


def _values(name: str, wrapped=None, params=None):
    """(reference value at `params`, value of `wrapped`), defaults: the case's."""
    params = CASES[name].params if params is None else params
    wrapped = CASES[name].make(params, ep.FixedDistrax) if wrapped is None else wrapped
    (reference, _), (value, _), _ = _both(name)(params, wrapped)
    return reference, value


def _touch(v):
    """A new array equal to `v`, of the same dtype (also for bool masks)."""
    return v + jnp.zeros((), v.dtype)


def _close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol, atol)


# `make test` runs every test on every other case (in sorted order: all three
# libraries, distributions and bijectors), `make test-slow` on the rest.
IN_MAKE_TEST = set(NAMES[::2])


def _grouped(names):
    """The cases as parameters, each in an xdist group of its own (`make test`
    runs `--dist=loadgroup`): one worker runs all of a case's tests, so its
    program (`_both`) is compiled once, not once per worker."""
    return [
        pytest.param(
            n,
            marks=[pytest.mark.xdist_group(n)]
            + ([] if n in IN_MAKE_TEST else [pytest.mark.slow]),
            id=n,
        )
        for n in names
    ]


@pytest.fixture(params=_grouped(NAMES))
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


@pytest.mark.parametrize("name", _grouped(WITH_FLOATS))
def test_filter_grad_matches_raw_grad(name):
    case = CASES[name]
    floats = _split(case.params)[0]
    wrapped = case.make(case.params, ep.FixedDistrax)
    (_, expected), (_, grads), _ = _both(name)(case.params, wrapped)
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
    reference, value = _values(name, again)
    _close(value, reference, rtol=1e-4)


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


def _has_array_argument(name: str) -> bool:
    promotion = "standard" if name in NOT_STRICT_UPSTREAM else "strict"
    with jax.numpy_dtype_promotion(promotion):
        wrapped = CASES[name].make(CASES[name].params, ep.FixedDistrax)
    return _first_array_where(wrapped) is not None


WITH_ARRAYS = [n for n in NAMES if _has_array_argument(n)]


@pytest.mark.parametrize("name", _grouped(WITH_ARRAYS))
def test_tree_at_on_a_parameter(name):
    case = CASES[name]
    wrapped = case.make(case.params, ep.FixedDistrax)
    where = _first_array_where(wrapped)
    assert where is not None  # (`WITH_ARRAYS`)
    old = where(wrapped)  # (the argument as given: a field is its argument)
    assert any(old is v for v in case.params.values())
    new_value = _touch(old) if old.dtype == bool else old * 1.01
    updated = eqx.tree_at(where, wrapped, new_value)
    assert where(updated) is new_value
    # Reference: the raw object built with the same substitution in the params.
    key = next(k for k, v in case.params.items() if v is old)
    expected, value = _values(name, updated, {**case.params, key: new_value})
    _close(value, expected, rtol=1e-4)


def test_plain_jit_traces_once_for_equal_wrappers(name):
    # Traced, not compiled (the values under jit are compared above): every leaf
    # is an array and the rest hashable structure, equal for equal wrappers.
    case, x = CASES[name], _input(name)
    traces = []

    @jax.jit
    def f(w, x):
        traces.append(None)
        return _value(w, case, x)

    f.trace(case.make(case.params, ep.FixedDistrax), x)
    fresh = {k: jnp.array(v) for k, v in case.params.items()}
    f.trace(case.make(fresh, ep.FixedDistrax), x)
    assert len(traces) == 1


def _scaled(params, factor):
    return {
        k: v * factor if eqx.is_inexact_array(v) and k not in ("lo", "hi") else v
        for k, v in params.items()
    }


# The cases whose vmap and scan values are compared (compiled); every case is
# traced through both (structure, shapes and dtypes, TFP's cache), which is what
# differs between cases: the values are the program `_both` checks.
VALUES_SAMPLED = IN_MAKE_TEST


def test_vmap_over_stacked_wrappers_and_scan_carry(name):
    """`jax.vmap` over wrappers stacked leaf by leaf equals a loop over them, and a
    wrapper carried through `lax.scan` keeps its structure and values (one
    compiled program for both; traced only outside `VALUES_SAMPLED`)."""
    case, x = CASES[name], _input(name)
    factors = (1.0, 1.05, 1.1)
    wrappers = [case.make(_scaled(case.params, f), ep.FixedDistrax) for f in factors]
    stacked = jtu.tree_map(lambda *v: jnp.stack(v), *wrappers)

    def step(carry, _):
        carry = jtu.tree_map(_touch, carry)
        return carry, _value(carry, case, x)

    @jax.jit
    def both(stacked, wrapped):
        mapped = jax.vmap(lambda w: _value(w, case, x))(stacked) if case.params else 0
        return mapped, jax.lax.scan(step, wrapped, None, length=3)

    if name not in VALUES_SAMPLED:
        mapped, (final, values) = jax.eval_shape(both, stacked, wrappers[0])
        assert jtu.tree_structure(final) == jtu.tree_structure(wrappers[0])
        reference = jax.eval_shape(lambda w: _value(w, case, x), wrappers[0])
        assert values.shape == (3, *reference.shape) and values.dtype == reference.dtype
        if case.params:
            assert (mapped.shape, mapped.dtype) == (values.shape, values.dtype)
        return
    mapped, (final, values) = both(stacked, wrappers[0])
    assert jtu.tree_structure(final) == jtu.tree_structure(wrappers[0])
    expected = [_values(name, params=_scaled(case.params, f))[0] for f in factors]
    _close(values, jnp.stack([expected[0]] * 3), rtol=1e-4)
    if case.params:
        _close(mapped, jnp.stack(expected), rtol=1e-4)


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


@pytest.mark.parametrize(
    "name", _grouped([n for n in NAMES if CASES[n].kind == "dist"])
)
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


def test_arguments_are_attributes_and_the_rest_is_the_librarys_own(name):
    """Each argument is the attribute of its name (the very object given); each
    other public attribute of the raw object is the wrapper's too, of the same
    kind: a method a callable `Method`, an array the library's array (shape
    included), anything else of the same type. The uniform set (`sample`,
    `batch_shape`, ...) is checked against the raw object elsewhere."""
    case = CASES[name]
    wrapped, raw = case.make(case.params, ep.FixedDistrax), case.make(case.params, RAW)
    for arg, value in wrapped.arguments.items():
        assert getattr(wrapped, arg) is value, arg
    for array in case.params.values():  # (nested ones included)
        assert any(array is x for x in jtu.tree_leaves(wrapped))
    for attr in dir(raw):
        if attr.startswith("_") or attr in wrapped.arguments:
            continue
        if attr in UNIFORM or not _readable(raw, attr):
            continue
        expected, got = getattr(raw, attr), getattr(wrapped, attr)
        if inspect.ismethod(expected):
            assert callable(got) and not eqx.is_array(got), attr
        elif eqx.is_array(expected):
            assert np.shape(got) == np.shape(expected), attr
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0, err_msg=attr)
        else:
            assert type(got) is type(expected), attr


# The wrapper's own uniform set, where a library lacks or misspells one.
UNIFORM = {n for n in dir(ep.FixedDistrax) if not n.startswith("_")}


def _readable(obj, attr) -> bool:
    try:
        getattr(obj, attr)
    except Exception:  # noqa: BLE001 - a property the library cannot compute
        return False
    return True
