"""Constrained parameters: `Bijector`, `Frozen`, `resolve`, `trainable`, log-dets.

References are independent of the code under test: hand-written JAX
(`jax.nn.softplus`, `jax.nn.sigmoid`), TFP's bijectors, autodiff Jacobians with
`slogdet`, and finite differences (`check_grads`).
"""

from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.test_util import check_grads
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfb = tfp.bijectors

SETTINGS = settings(max_examples=20, deadline=None)
# Log10 of the range each dtype must round-trip (DESIGN.md §2), and the tolerance.
EXPONENT = {"float32": 6, "float64": 30}
RTOL = {"float32": 1e-6, "float64": 1e-12}
DTYPES = pytest.mark.parametrize("dtype", ["float32", "float64"])


def precision(dtype):
    """x64 mode for float64 only, restored on exit so that nothing leaks."""
    return jax.enable_x64(dtype == "float64")


def powers_of_ten(data, low, high, size):
    exponents = data.draw(st.lists(st.floats(low, high), min_size=size, max_size=size))
    return 10.0 ** np.array(exponents)


def sigmoid(x):  # NumPy references: independent, and nothing to compile
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def softplus(x):
    return np.logaddexp(0, np.asarray(x, np.float64))


def cube(x):  # module-level: a static transform that is the same object every time
    return x**3


class ScaleBy(eqx.Module):
    """A user transform holding a `Bijector` of its own."""

    factor: Any  # an `ep.Bijector` node, resolved before use

    def forward(self, x):
        return self.factor * x

    def forward_log_det_jacobian(self, x):
        return jnp.log(jnp.abs(self.factor)) * jnp.ones_like(x)


class TraceCounter:
    """`eqx.filter_jit(f)`, counting how often `f` is traced (compiled)."""

    def __init__(self, f):
        self.traces = 0

        def counted(*args):
            self.traces += 1
            return f(*args)

        self.jitted = eqx.filter_jit(counted)

    def __call__(self, *args):
        return self.jitted(*args)


# One compilation per shape: eager `resolve` compiles each operation separately.
resolve = eqx.filter_jit(ep.resolve)


# ------------------------------------------------------------------ round trips


@DTYPES
@SETTINGS
@given(data=st.data())
def test_positive_round_trip(dtype, data):
    e = EXPONENT[dtype]
    with precision(dtype):
        v = powers_of_ten(data, -e, e, 8).astype(dtype)
        p = ep.positive(v)
        assert p.param.dtype == dtype and np.isfinite(p.param).all()
        np.testing.assert_allclose(resolve(p), v, rtol=RTOL[dtype], atol=0)


@DTYPES
@SETTINGS
@given(data=st.data())
def test_bounded_round_trip(dtype, data):
    """To rounding relative to the bounds' magnitude, and to the value if low = 0."""
    e = EXPONENT[dtype]
    with precision(dtype):
        low = data.draw(st.one_of(st.just(0.0), st.floats(-1e3, 1e3)))
        high = low + 10.0 ** data.draw(st.floats(-3, 3))
        u = powers_of_ten(data, -e, 0, 4) / 2  # distance from a bound, over width
        v = np.concatenate([low + u * (high - low), high - u * (high - low)])
        (lo, hi) = np.asarray([low, high], dtype)
        # A value within a few ulps of a bound resolves onto it, which is outside
        # the open interval: an error (tested below), not a round trip.
        margin = 4 * np.spacing(max(abs(lo), abs(hi)))
        v = np.clip(v.astype(dtype), lo + margin, hi - margin)
        b = ep.bounded(v, low, high)
        assert np.isfinite(b.param).all()
        scale = 0.0 if low == 0 else max(abs(low), abs(high))
        out = np.asarray(resolve(b), np.float64)
        np.testing.assert_allclose(out, v, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)


@DTYPES
@SETTINGS
@given(data=st.data())
def test_lower_cholesky_round_trip(dtype, data):
    e = EXPONENT[dtype]
    with precision(dtype):
        n = data.draw(st.integers(1, 3))
        size = n * (n + 1) // 2
        off = data.draw(st.lists(st.floats(-1e3, 1e3), min_size=size, max_size=size))
        L = np.zeros((n, n))
        L[np.tril_indices(n, -1)] = off[: size - n]
        L[np.diag_indices(n)] = powers_of_ten(data, -e, e, n)
        L = L.astype(dtype)
        chol = ep.lower_cholesky(L)
        assert chol.param.shape == (size,)
        out = resolve(chol)
        np.testing.assert_allclose(out, L, rtol=RTOL[dtype], atol=0)
        below = np.tril_indices(n, -1)  # passed through unchanged
        np.testing.assert_array_equal(np.asarray(out)[below], L[below])


@DTYPES
@SETTINGS
@given(data=st.data())
def test_simplex_round_trip(dtype, data):
    """Entries down to 1e-6 (float32) or 1e-30 (float64).

    float32 gets 2e-6 rather than 1e-6: the unconstrained coordinates reach
    |x| ~ 14, where half an ulp is 5e-7, and each entry depends on all of them
    through the normalisation, so even correctly rounded parameters pushed through
    an exact softmax miss 1e-6 (measured: 9e-7 + the float32 softmax's 3e-7).
    """
    e = EXPONENT[dtype]
    with precision(dtype):
        k = data.draw(st.integers(1, 4))
        w = powers_of_ten(data, 1 - e, 0, k)  # w / w.sum() >= 10**-e for k <= 10
        v = (w / w.sum()).astype(dtype)
        probs = ep.simplex(v)
        assert probs.param.shape == (k - 1,)
        rtol = 2e-6 if dtype == "float32" else RTOL[dtype]
        np.testing.assert_allclose(resolve(probs), v, rtol=rtol, atol=0)


SOFTPLUS = ep.positive(1.0).transform  # the shortcut's transform, no arrays


def test_dense_grids_float32():
    """Every float32 from 1e-6 to 1e6 sampled densely, where hypothesis would
    rarely hit the worst case (without the Newton step, 1e-4 of these miss)."""
    v = np.logspace(-6, 6, 100_000, dtype=np.float32)
    np.testing.assert_allclose(resolve(ep.positive(v)), v, rtol=1e-6, atol=0)
    u = np.logspace(-6, np.log10(0.5), 50_000, dtype=np.float32)
    v = np.concatenate([u, 1 - u])
    np.testing.assert_allclose(resolve(ep.bounded(v, 0, 1)), v, rtol=1e-6, atol=0)


@DTYPES
def test_extremes_have_finite_gradients(dtype):
    """Building (the inverse), resolving (the forward) and the log-det."""
    e = EXPONENT[dtype]
    with precision(dtype):
        values = jnp.array([10.0**-e, 1.0, 10.0**e], dtype)
        params = ep.positive(values).param

        def build(v):
            return ep.positive(v).param

        def resolved(p):
            return ep.resolve(ep.Bijector(p, SOFTPLUS))

        def log_det(p):
            return ep.log_det_jacobian(ep.Bijector(p, SOFTPLUS))

        def inside(v):
            return ep.bounded(v, 0.0, 1.0).param

        top = 1 - 4 * np.finfo(dtype).eps  # nearer to 1 resolves onto the bound
        near = jnp.array([10.0**-e, top], dtype)  # inside (0, 1)
        cases = [(build, values), (resolved, params), (log_det, params), (inside, near)]

        @jax.jit
        def all_grads():
            return [jax.vmap(jax.grad(f))(x) for f, x in cases]

        grads = all_grads()
        for g in grads:
            assert g.dtype == dtype and np.isfinite(g).all()
        # d(inverse)/dy = 1 / softplus'(x) = 1 / sigmoid(x)
        np.testing.assert_allclose(grads[0], 1 / sigmoid(params), rtol=1e-6)


# ----------------------------------------------------- shortcuts, as a matrix

SHORTCUTS = {
    "positive": lambda: ep.positive(jnp.array([0.1, 1.0, 30.0])),
    "bounded": lambda: ep.bounded(jnp.array([-0.9, 0.5, 2.9]), -1.0, 3.0),
    "lower_cholesky": lambda: ep.lower_cholesky(
        jnp.array([[1.5, 0.0, 0.0], [-0.3, 0.2, 0.0], [2.0, 0.7, 3.0]])
    ),
    "simplex": lambda: ep.simplex(jnp.array([0.1, 0.2, 0.3, 0.4])),
}
TFP = {
    "positive": lambda t: tfb.Softplus(),
    "bounded": lambda t: tfb.Sigmoid(low=t.low, high=t.high),
    "lower_cholesky": lambda t: tfb.FillScaleTriL(
        diag_bijector=tfb.Softplus(), diag_shift=None
    ),
    "simplex": lambda t: tfb.SoftmaxCentered(),
}
shortcuts = pytest.mark.parametrize("name", SHORTCUTS, ids=list(SHORTCUTS))


def coordinates(name, y):
    """The free coordinates of a constrained value, for an autodiff log-det."""
    if name == "lower_cholesky":
        return y[np.tril_indices(y.shape[-1])]
    if name == "simplex":
        return y[:-1]
    return y


@pytest.mark.slow
def test_check_grads_on_the_shortcut_transforms():
    """Finite differences against autodiff, in float64: forward, inverse and
    log-det of every shortcut's transform, checked together (one compilation)."""
    with jax.enable_x64(True):
        nodes = {name: make() for name, make in SHORTCUTS.items()}
        params = {name: b.param for name, b in nodes.items()}
        values = {name: resolve(b) for name, b in nodes.items()}
        assert all(x.dtype == jnp.float64 for x in params.values())

        @jax.jit
        def transforms(params, values):
            return {
                name: (
                    b.transform.forward(params[name]),
                    b.transform.inverse(values[name]),
                    b.transform.forward_log_det_jacobian(params[name]),
                )
                for name, b in nodes.items()
            }

        check_grads(transforms, (params, values), order=1, modes=("fwd", "rev"))


@shortcuts
def test_shortcut_agrees_with_tfp_and_autodiff_log_det(name):
    """Forward, inverse and log-det against TFP's bijector, and the log-det
    against `slogdet` of the autodiff Jacobian onto the free coordinates."""
    with jax.enable_x64(True):
        b = SHORTCUTS[name]()

        @jax.jit
        def references(b):
            y = ep.resolve(b)
            ref = TFP[name](b.transform)
            x = ref.inverse(y)
            y_tfp = ref.forward(x + 0.0)  # a new array: TFP's cache can't answer
            tfp_log_det = jnp.sum(ref.forward_log_det_jacobian(x))

            def free(x):
                return coordinates(name, b.transform.forward(x))

            jacobian = jax.jacfwd(free)(b.param)
            return y, x, y_tfp, tfp_log_det, jacobian, ep.log_det_jacobian(b)

        y, x_tfp, y_tfp, tfp_log_det, jacobian, log_det = references(b)
        np.testing.assert_allclose(y_tfp, y, rtol=1e-12, atol=1e-12)
        if name != "lower_cholesky":  # TFP fills the triangle in another order
            np.testing.assert_allclose(x_tfp, b.param, rtol=1e-10)
        if name == "simplex":  # TFP's log-det is w.r.t. the embedded simplex:
            tfp_log_det -= 0.5 * np.log(b.param.shape[-1] + 1)  # + log(n) / 2
        np.testing.assert_allclose(log_det, tfp_log_det, rtol=1e-12)
        expected = np.linalg.slogdet(np.asarray(jacobian))[1]
        np.testing.assert_allclose(log_det, expected, rtol=1e-12)


# ------------------------------------------------------------------ gradients


def test_filter_grad_through_resolve_matches_hand_written():
    L = jnp.array([[1.5, 0.0, 0.0], [-0.3, 0.2, 0.0], [2.0, 0.7, 3.0]])
    model = {
        "scale": ep.positive(jnp.array([0.5, 2.0])),
        "rate": ep.bounded(jnp.array([0.2, 0.9]), -1.0, 3.0),
        "chol": ep.lower_cholesky(L),
        "probs": ep.simplex(jnp.array([0.2, 0.3, 0.5])),
    }
    w = {
        "scale": jnp.array([1.0, -2.0]),
        "rate": jnp.array([0.5, 3.0]),
        "chol": jnp.arange(9.0).reshape(3, 3) - 4,
        "probs": jnp.array([1.0, -1.0, 2.0]),
    }

    def loss(m):
        values = ep.resolve(m)
        return sum(jnp.sum(w[k] * values[k] ** 2) for k in w)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(model)
    w = {k: np.asarray(v) for k, v in w.items()}

    p = np.asarray(model["scale"].param)
    expected = 2 * w["scale"] * softplus(p) * sigmoid(p)
    np.testing.assert_allclose(grads["scale"].param, expected, rtol=1e-6)

    p = np.asarray(model["rate"].param)
    y = 3.0 * sigmoid(p) - 1.0 * sigmoid(-p)
    expected = 2 * w["rate"] * y * 4.0 * sigmoid(p) * sigmoid(-p)
    np.testing.assert_allclose(grads["rate"].param, expected, rtol=1e-5)

    rows, cols = np.tril_indices(3)
    expected = (2 * w["chol"] * np.asarray(L))[rows, cols]
    p = np.asarray(model["chol"].param)
    expected = np.where(rows == cols, expected * sigmoid(p), expected)
    np.testing.assert_allclose(grads["chol"].param, expected, rtol=1e-5)

    y = np.array([0.2, 0.3, 0.5])
    g = 2 * w["probs"] * y  # d loss / d y, then the softmax Jacobian
    expected = (y * (g - np.sum(g * y)))[:-1]
    np.testing.assert_allclose(grads["probs"].param, expected, rtol=1e-5, atol=1e-6)


def test_grad_through_nested_bijector():
    p = jnp.array(-0.4)
    grad = jax.grad(lambda p: ep.resolve(ep.Bijector(ep.Bijector(p, SOFTPLUS), cube)))
    s = softplus(p)
    np.testing.assert_allclose(grad(p), 3 * s**2 * sigmoid(p), rtol=1e-6)


# ------------------------------------------------------------------ resolve


def test_resolve_whole_tree_leaves_other_nodes_alone():
    x = jnp.array([1.0, 2.0])
    tree = {
        "a": ep.positive(2.0),
        "b": [x, ep.frozen(jnp.array(3.0)), "keep"],
        "c": (ep.bounded(0.25, 0.0, 1.0),),
        "n": None,
        "i": 3,
    }
    out = ep.resolve(tree)
    assert jtu.tree_structure(out) == jtu.tree_structure(
        {"a": 0, "b": [0, 0, 0], "c": (0,), "n": None, "i": 0}
    )
    assert out["b"][0] is x and out["b"][2] == "keep" and out["i"] == 3
    np.testing.assert_allclose(out["a"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(out["c"][0], 0.25, rtol=1e-6)
    assert out["b"][1] == 3.0
    again = ep.resolve(out)  # idempotent
    assert jtu.tree_structure(again) == jtu.tree_structure(out)
    assert all(a is b for a, b in zip(jtu.tree_leaves(again), jtu.tree_leaves(out)))


def test_resolve_innermost_first():
    p = jnp.array(0.4)
    nested = ep.Bijector(ep.Bijector(p, jnp.exp), cube)  # cube(exp(p)), not exp(p³)
    np.testing.assert_allclose(ep.resolve(nested), jnp.exp(p) ** 3, rtol=1e-6)
    scaled = ep.Bijector(jnp.array([1.0, -2.0]), ScaleBy(ep.positive(2.0)))
    np.testing.assert_allclose(ep.resolve(scaled), [2.0, -4.0], rtol=1e-6)
    from_frozen = ep.Bijector(ep.frozen(jnp.array(0.3)), jnp.exp)
    np.testing.assert_allclose(ep.resolve(from_frozen), jnp.exp(0.3), rtol=1e-6)


def test_frozen_stops_gradients_but_not_values():
    tree = {"a": ep.positive(2.0), "f": ep.frozen(ep.positive(3.0))}

    def loss(t):
        values = ep.resolve(t)
        return values["a"] * values["f"]

    grads = eqx.filter_grad(loss)(tree)
    assert grads["f"].value.param == 0.0
    assert grads["a"].param != 0.0
    np.testing.assert_allclose(loss(tree), 6.0, rtol=1e-6)


def test_is_bijector():
    assert ep.is_bijector(ep.positive(1.0))
    assert not ep.is_bijector(ep.frozen(jnp.array(1.0)))
    assert not ep.is_bijector(ep.FixedDistrax(tfb.Softplus))
    assert not ep.is_bijector(jnp.array(1.0))
    tree = [ep.positive(1.0), ep.frozen(ep.positive(2.0)), jnp.ones(2)]
    nodes = jtu.tree_leaves(tree, is_leaf=ep.is_bijector)
    assert [ep.is_bijector(n) for n in nodes] == [True, True, False]


# ------------------------------------------------------------ transform kinds


def _chain_derivative(x):
    s = sigmoid(x)
    return (1 - np.tanh(s) ** 2) * s * (1 - s)


# name: (make the transform, NumPy forward, NumPy derivative)
TRANSFORMS = {
    "FixedDistrax(tfb.Softplus)": (
        lambda: ep.FixedDistrax(tfb.Softplus),
        softplus,
        sigmoid,
    ),
    "FixedDistrax(distrax.Tanh)": (
        lambda: ep.FixedDistrax(distrax.Tanh),
        np.tanh,
        lambda x: 1 - np.tanh(x) ** 2,
    ),
    "raw distrax.Sigmoid": (
        distrax.Sigmoid,
        sigmoid,
        lambda x: sigmoid(x) * sigmoid(-x),
    ),
    "raw distrax.Chain": (
        lambda: distrax.Chain([distrax.Tanh(), distrax.Sigmoid()]),
        lambda x: np.tanh(sigmoid(x)),
        _chain_derivative,
    ),
    "raw tfb.Exp": (tfb.Exp, np.exp, np.exp),
    "raw tfb.Scale": (
        lambda: tfb.Scale(jnp.array(3.0)),
        lambda x: 3.0 * x,
        lambda x: np.full_like(x, 3.0),
    ),
    "raw tfb.Chain": (
        lambda: tfb.Chain([tfb.Shift(jnp.array(1.0)), tfb.Softplus()]),
        lambda x: softplus(x) + 1.0,
        sigmoid,
    ),
    "callable": (lambda: cube, lambda x: x**3, lambda x: 3 * x**2),
}
transforms = pytest.mark.parametrize("name", TRANSFORMS, ids=list(TRANSFORMS))
X = jnp.array([-0.7, 0.2, 1.3])


@transforms
def test_transform_kinds_resolve_and_differentiate(name):
    make, forward, derivative = TRANSFORMS[name]
    b = ep.Bijector(X, make())
    x = np.asarray(X, np.float64)
    np.testing.assert_allclose(jax.jit(ep.resolve)(b), forward(x), rtol=1e-6)
    grad = eqx.filter_jit(eqx.filter_grad(lambda b: jnp.sum(ep.resolve(b))))(b)
    np.testing.assert_allclose(grad.param, derivative(x), rtol=1e-6)
    spec = ep.trainable(b)
    assert spec.param is True and not any(jtu.tree_leaves(spec.transform))
    if name == "callable":
        with pytest.raises(TypeError, match="no `forward_log_det_jacobian`"):
            ep.log_det_jacobian(b)
        with pytest.raises(TypeError, match="no `inverse`"):
            ep.Bijector.from_value(forward(x), make())
        return
    expected = np.sum(np.log(np.abs(derivative(x))))
    log_det = eqx.filter_jit(ep.log_det_jacobian)(b)
    np.testing.assert_allclose(log_det, expected, rtol=1e-5)
    built = ep.Bijector.from_value(forward(x).astype(np.float32), make())
    np.testing.assert_allclose(built.param, X, rtol=1e-5, atol=1e-6)


@transforms
def test_equal_fresh_transforms_compile_once(name):
    make, _, _ = TRANSFORMS[name]
    f = TraceCounter(ep.resolve)
    f(ep.Bijector(X, make()))
    f(ep.Bijector(X + 1.0, make()))
    assert f.traces == 1


# ---------------------------------------------------------- log-det-Jacobian


def test_log_det_jacobian_hand_written():
    p = ep.positive(jnp.array([1e-3, 0.5, 40.0]))
    expected = jnp.sum(jnp.log(jax.nn.sigmoid(p.param)))  # softplus' = sigmoid
    np.testing.assert_allclose(ep.log_det_jacobian(p), expected, rtol=1e-6)

    b = ep.bounded(jnp.array([0.1, 1.9]), 0.0, 2.0)
    s = jax.nn.sigmoid(b.param)
    expected = jnp.sum(jnp.log(2.0 * s * (1 - s)))
    np.testing.assert_allclose(ep.log_det_jacobian(b), expected, rtol=1e-5)

    tree = {"p": p, "b": [b, jnp.ones(3)], "frozen": ep.frozen(ep.positive(5.0))}
    total = ep.log_det_jacobian(p) + ep.log_det_jacobian(b)  # frozen: a constant
    np.testing.assert_allclose(ep.log_det_jacobian(tree), total, rtol=1e-6)
    assert ep.log_det_jacobian({"x": jnp.ones(2)}) == 0.0


def test_log_det_jacobian_chain_rule_for_nested_nodes():
    p = jnp.array(-0.4)
    nested = ep.Bijector(ep.Bijector(p, SOFTPLUS), SOFTPLUS)
    derivative = jax.grad(lambda p: jax.nn.softplus(jax.nn.softplus(p)))(p)
    np.testing.assert_allclose(
        ep.log_det_jacobian(nested), jnp.log(derivative), rtol=1e-6
    )
    inner = ep.positive(2.0)
    scaled = ep.Bijector(jnp.ones(3), ScaleBy(inner))  # the transform's own node
    expected = 3 * jnp.log(2.0) + jnp.log(jax.nn.sigmoid(inner.param))
    np.testing.assert_allclose(ep.log_det_jacobian(scaled), expected, rtol=1e-6)


# ------------------------------------------------------------------ trainable


class Model(eqx.Module):
    scale: ep.Bijector
    rate: ep.Bijector
    noise: ep.Frozen
    prior_scale: ep.Frozen
    weight: jax.Array
    count: jax.Array
    offset: float


def make_model():
    return Model(
        scale=ep.positive(1.0),
        rate=ep.bounded(0.5, 0.1, 2.0),
        noise=ep.frozen(jnp.array(0.3)),
        prior_scale=ep.frozen(ep.positive(2.0)),
        weight=jnp.array([1.0, -1.0]),
        count=jnp.array(3),
        offset=0.5,
    )


def loss(model):
    m = ep.resolve(model)
    fit = (m.scale - 3.0) ** 2 + (m.rate - 1.5) ** 2
    return fit + m.noise * jnp.sum(m.weight**2) + m.prior_scale * m.scale * m.count


def test_trainable_spec():
    model = make_model()
    spec = ep.trainable(model)
    assert jtu.tree_structure(spec) == jtu.tree_structure(model)
    assert spec.scale.param is True and spec.rate.param is True
    assert spec.rate.transform.low is False and spec.rate.transform.high is False
    assert spec.noise.value is False and spec.prior_scale.value.param is False
    assert spec.weight is True and spec.count is False and spec.offset is False
    nested = ep.Bijector(jnp.ones(2), ScaleBy(ep.positive(2.0)))
    spec = ep.trainable(nested)  # a node inside a transform is still trainable
    assert spec.param is True and spec.transform.factor.param is True
    fixed = ep.Bijector(jnp.ones(2), ep.FixedDistrax(tfb.Scale, jnp.array(3.0)))
    assert jtu.tree_leaves(ep.trainable(fixed)) == [True, False]


def _partition_cases():
    """Trees for `ep.partition`: plain arrays of every kind, nodes inside nodes,
    frozen values, wrappers, `None`s, NumPy arrays, Python numbers, empties."""
    paramax = pytest.importorskip("paramax")
    return {
        "model": make_model(),
        "plain": [jnp.ones(2), jnp.arange(3), jnp.array(True), np.ones(2), 1.5, None],
        "complex and bfloat16": (jnp.ones(2, jnp.complex64), jnp.ones(2, jnp.bfloat16)),
        "nested": ep.Bijector(jnp.ones(2), ScaleBy(ep.positive(2.0))),
        "wrapper": {
            "d": ep.FixedDistrax(distrax.Normal, jnp.zeros(2), ep.positive(1.0)),
            "f": ep.frozen(ep.FixedDistrax(distrax.Normal, 0.0, 1.0)),
        },
        "paramax": [paramax.non_trainable(jnp.array(0.7)), jnp.ones(1)],
        "empty": {},
        "only nodes": [ep.positive(1.0), ep.bounded(0.5, 0.0, 1.0)],
    }


def test_partition_equals_eqx_partition_with_trainable():
    for name, tree in _partition_cases().items():
        ours = ep.partition(tree)
        reference = eqx.partition(tree, ep.trainable(tree))
        for a, b in zip(ours, reference):
            assert jtu.tree_structure(a) == jtu.tree_structure(b), name
            assert all(x is y for x, y in zip(jtu.tree_leaves(a), jtu.tree_leaves(b)))
        assert eqx.tree_equal(eqx.combine(*ours), tree), name


def test_partition_under_jit_and_vmap_equals_eager():
    model = make_model()
    eager = ep.partition(model)
    traced = eqx.filter_jit(ep.partition)(model)
    for a, b in zip(eager, traced):
        assert eqx.tree_equal(a, b)
    batched = eqx.filter_vmap(lambda x: ep.partition(ep.positive(x))[0].param)(
        jnp.ones(3)
    )
    assert batched.shape == (3,)


def train(model, filter_spec, steps=40):
    optim = optax.adamw(0.1, weight_decay=0.5)
    params, static = eqx.partition(model, filter_spec)
    state = optim.init(params)

    @eqx.filter_jit
    def step(params, state):
        grads = eqx.filter_grad(lambda p: loss(eqx.combine(p, static)))(params)
        with jax.numpy_dtype_promotion("standard"):  # optax is not strict-clean
            updates, state = optim.update(grads, state, params)
        return eqx.apply_updates(params, updates), state

    for _ in range(steps):
        params, state = step(params, state)
    return eqx.combine(params, static)


def test_weight_decay_moves_neither_frozen_values_nor_bounds():
    model = make_model()
    trained = train(model, ep.trainable(model))
    assert loss(trained) < loss(model)

    def same(where):
        return np.array_equal(where(trained), where(model))

    assert same(lambda m: m.noise.value)
    assert same(lambda m: m.prior_scale.value.param)
    assert same(lambda m: m.rate.transform.low)
    assert same(lambda m: m.rate.transform.high)
    assert same(lambda m: m.count)
    assert not same(lambda m: m.scale.param)
    assert not same(lambda m: m.rate.param)
    assert not same(lambda m: m.weight)
    # The control: filtering by `eqx.is_inexact_array`, weight decay (and, for
    # the bounds, gradients) move all of them.
    naive = train(model, eqx.is_inexact_array)
    assert naive.noise.value != model.noise.value
    assert naive.prior_scale.value.param != model.prior_scale.value.param
    assert naive.rate.transform.low != model.rate.transform.low


@DTYPES
def test_parameters_have_concrete_dtypes_and_compile_once(dtype):
    with precision(dtype):
        model = {
            "a": ep.positive(1.0),
            "b": ep.bounded(0.5, 0, 1),
            "c": ep.Bijector(2, cube),
            "d": ep.lower_cholesky([[1.0, 0.0], [0.5, 2.0]]),  # pyright: ignore[reportArgumentType]
            "e": ep.simplex([0.5, 0.5]),  # pyright: ignore[reportArgumentType]
            "f": ep.Bijector.from_value(2, tfb.Exp()),
        }
        for node in jtu.tree_leaves(model, is_leaf=ep.is_bijector):
            assert node.param.dtype == dtype and not node.param.weak_type

        def run(model, steps=4):
            optim = optax.sgd(0.01)
            params, static = eqx.partition(model, ep.trainable(model))

            def objective(p):
                values = jtu.tree_leaves(ep.resolve(eqx.combine(p, static)))
                return sum(jnp.sum(x) for x in values)

            def update(params, state):
                grads = eqx.filter_grad(objective)(params)
                with jax.numpy_dtype_promotion("standard"):  # optax is not strict-clean
                    updates, state = optim.update(grads, state)
                return optax.apply_updates(params, updates), state

            step = TraceCounter(update)
            state = optim.init(params)
            for _ in range(steps):
                params, state = step(params, state)
            return step.traces

        # From Python floats and ints (the shortcuts share the conversion)
        assert run({k: model[k] for k in "abc"}) == 1
        # The control: a weakly typed parameter (`jnp.asarray(1.0)`) becomes
        # strongly typed in its first update, and the step compiles again.
        weak = eqx.tree_at(lambda b: b.param, model["a"], jnp.asarray(1.0))
        assert weak.param.weak_type
        assert run(weak) > 1


# --------------------------------------------------- transformations, storage


@pytest.mark.slow
def test_vmap_construction_equals_loop():
    values = jnp.array([0.1, 1.0, 7.0])
    lows = jnp.array([-1.0, 0.0, 5.0])
    highs = lows + jnp.array([1.0, 2.0, 4.0])
    Ls = jnp.array([[[1.0, 0.0], [0.5, 2.0]], [[3.0, 0.0], [-1.0, 0.1]]])
    probs = jnp.array([[0.2, 0.8], [0.6, 0.4]])

    def build(v, lo, hi):
        return {"p": ep.positive(v), "b": ep.bounded(lo + 0.25 * (hi - lo), lo, hi)}

    batched = eqx.filter_jit(jax.vmap(build))(values, lows, highs)
    loop = [build(*args) for args in zip(values, lows, highs)]
    stacked = jtu.tree_map(lambda *xs: jnp.stack(xs), *loop)
    assert jtu.tree_structure(batched) == jtu.tree_structure(stacked)
    for a, b in zip(jtu.tree_leaves(batched), jtu.tree_leaves(stacked)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(resolve(batched)["p"], values, rtol=1e-6)

    for shortcut, batch in [(ep.lower_cholesky, Ls), (ep.simplex, probs)]:
        by_vmap = eqx.filter_jit(jax.vmap(shortcut))(batch).param
        by_loop = jnp.stack([shortcut(x).param for x in batch])
        whole = shortcut(batch).param  # batch dimensions are supported directly
        np.testing.assert_allclose(by_vmap, by_loop, rtol=1e-6)
        np.testing.assert_allclose(whole, by_loop, rtol=1e-6)
        np.testing.assert_allclose(resolve(shortcut(batch)), batch, rtol=1e-6)


def test_lax_scan_over_a_model_with_bijectors():
    model = {"scale": ep.positive(jnp.array([0.5, 2.0])), "rate": ep.bounded(0.3, 0, 1)}
    params, static = eqx.partition(model, ep.trainable(model))

    def objective(p):
        values = ep.resolve(eqx.combine(p, static))
        return jnp.sum((values["scale"] - 1.0) ** 2) + (values["rate"] - 0.9) ** 2

    def step(p, _):
        grads = jax.grad(objective)(p)
        p = jtu.tree_map(lambda x, g: x - 0.5 * g, p, grads)
        return p, objective(p)

    scanned, history = lax.scan(step, params, None, length=5)
    looped, losses = params, []
    for _ in range(5):
        looped, value = jax.jit(step)(looped, None)
        losses.append(value)
    np.testing.assert_allclose(history, losses, rtol=1e-5)
    for a, b in zip(jtu.tree_leaves(scanned), jtu.tree_leaves(looped)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert history[-1] < objective(params)

    stacked = jax.vmap(ep.positive)(jnp.array([1.0, 2.0, 3.0]))  # as `xs`
    total, ys = lax.scan(lambda c, b: (c + ep.resolve(b), ep.resolve(b)), 0.0, stacked)
    np.testing.assert_allclose(ys, [1.0, 2.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(total, 6.0, rtol=1e-6)


def test_tree_serialise_leaves_round_trip(tmp_path):
    def build(k):
        return {
            "scale": ep.positive(jnp.array([0.5, 2.0]) * k),
            "rate": ep.bounded(0.3, 0.0, k),
            "chol": ep.lower_cholesky(jnp.array([[1.0, 0.0], [0.5, k]])),
            "tfp": ep.Bijector(0.2 * k, tfb.Scale(jnp.array(3.0 * k))),
            "distrax": ep.Bijector(0.1 * k, distrax.Sigmoid()),
            "noise": ep.frozen(jnp.array(0.1 * k)),
        }

    model, like = build(1.0), build(2.0)
    eqx.tree_serialise_leaves(tmp_path / "model.eqx", model)
    loaded = eqx.tree_deserialise_leaves(tmp_path / "model.eqx", like)
    assert jtu.tree_structure(loaded) == jtu.tree_structure(model)
    for a, b in zip(jtu.tree_leaves(loaded), jtu.tree_leaves(model)):
        np.testing.assert_array_equal(a, b)
    values, expected = ep.resolve(loaded), ep.resolve(model)
    for a, b in zip(jtu.tree_leaves(values), jtu.tree_leaves(expected)):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ bad inputs

BAD = {
    "positive: negative": (lambda: ep.positive(-1.5), ValueError, "value = -1.5"),
    "positive: zero": (
        lambda: ep.positive(jnp.array([1.0, 0.0])),
        ValueError,
        r"value\[1\] = 0.0",
    ),
    "positive: nan": (lambda: ep.positive(jnp.nan), ValueError, "value = nan"),
    "positive: inf": (lambda: ep.positive(jnp.inf), ValueError, "value = inf"),
    "bounded: above": (
        lambda: ep.bounded(1.5, 0.0, 1.0),
        ValueError,
        r"ep.bounded: the value must lie in constraints.interval\(0.0, 1.0\), "
        r"but value = 1.5",
    ),
    "bounded: at low (open)": (
        lambda: ep.bounded(0.0, 0.0, 1.0),
        ValueError,
        "interval.* but value = 0.0. The interval is open",
    ),
    "bounded: at high (open)": (
        lambda: ep.bounded(jnp.array([0.5, 1.0]), 0.0, 1.0),
        ValueError,
        r"value\[1\] = 1.0",
    ),
    "bounded: low > high": (
        lambda: ep.bounded(0.5, 1.0, 0.0),
        ValueError,
        r"\(low, high\) = \(1.0, 0.0\)",
    ),
    "bounded: nan bound": (
        lambda: ep.bounded(0.5, jnp.nan, 1.0),
        ValueError,
        r"`low` must be finite.*low = nan",
    ),
    "bounded: infinite array bound": (
        lambda: ep.bounded(jnp.array([0.5, 0.5]), 0.0, jnp.array([1.0, jnp.inf])),
        ValueError,
        r"`high` must be finite.*high\[1\] = inf.*greater_than",
    ),
    "lower_cholesky: upper entry": (
        lambda: ep.lower_cholesky(jnp.array([[1.0, 2.0], [0.0, 1.0]])),
        ValueError,
        r"lower_cholesky, but value = \[\[1., 2.\]",
    ),
    "lower_cholesky: negative diagonal": (
        lambda: ep.lower_cholesky(jnp.array([[1.0, 0.0], [3.0, -1.0]])),
        ValueError,
        r"lower_cholesky, but value = .*-1.\]\]. Pass `jnp.linalg.cholesky",
    ),
    "lower_cholesky: zero diagonal": (
        lambda: ep.lower_cholesky(jnp.array([[0.0, 0.0], [3.0, 1.0]])),
        ValueError,
        r"lower_cholesky, but value = \[\[0., 0.\]",
    ),
    "lower_cholesky: not square": (
        lambda: ep.lower_cholesky(jnp.ones((2, 3))),
        ValueError,
        r"shape \(2, 3\)",
    ),
    "lower_cholesky: infinite entry": (
        lambda: ep.lower_cholesky(jnp.array([[1.0, 0.0], [jnp.inf, 1.0]])),
        ValueError,
        r"lower_cholesky, but value = .*inf",
    ),
    "simplex: sum": (
        lambda: ep.simplex(jnp.array([0.5, 0.6])),
        ValueError,
        r"simplex, but value = \[0.5, 0.6\]. Entries must be > 0 and sum to 1",
    ),
    "simplex: batch sum": (
        lambda: ep.simplex(jnp.array([[0.5, 0.5], [0.2, 0.2]])),
        ValueError,
        r"value\[1\] = \[0.2, 0.2\]",
    ),
    "simplex: negative": (
        lambda: ep.simplex(jnp.array([-0.1, 1.1])),
        ValueError,
        r"simplex, but value = \[-0.1,  1.1\]",
    ),
    "simplex: zero": (
        lambda: ep.simplex(jnp.array([0.0, 1.0])),
        ValueError,
        r"simplex, but value = \[0., 1.\]. Entries must be > 0",
    ),
    "simplex: scalar": (lambda: ep.simplex(1.0), ValueError, r"shape \(\)"),
    "from_value: tfp range": (
        lambda: ep.Bijector.from_value(-2.0, tfb.Softplus()),
        ValueError,
        r"outside the range of the bijector .*Softplus.* value = -2.0",
    ),
    "from_value: distrax range": (
        lambda: ep.Bijector.from_value(jnp.array([0.5, 1.5]), distrax.Sigmoid()),
        ValueError,
        r"distrax.Sigmoid\(\).* value\[1\] = 1.5",
    ),
    "from_value: no inverse": (
        lambda: ep.Bijector.from_value(1.0, cube),
        TypeError,
        "no `inverse`",
    ),
    "raw distrax with arrays": (
        lambda: ep.Bijector(0.0, distrax.ScalarAffine(shift=1.0, scale=2.0)),
        TypeError,
        r"ep.FixedDistrax\(distrax.ScalarAffine",
    ),
    "a distribution": (
        lambda: ep.Bijector(0.0, ep.FixedDistrax(distrax.Normal, 0.0, 1.0)),
        TypeError,
        "wraps a distribution",
    ),
    "not a transform": (
        lambda: ep.Bijector(0.0, "softplus"),
        TypeError,
        "got 'softplus'",
    ),
}


@pytest.mark.parametrize("name", BAD, ids=list(BAD))
def test_bad_inputs(name):
    make, error, message = BAD[name]
    with pytest.raises(error, match=message):
        make()


def test_traced_bad_inputs_fail_at_run_time():
    upper = jnp.array([[1.0, 2.0], [0.0, 1.0]])  # the inverse alone would pass it
    with pytest.raises(
        eqx.EquinoxRuntimeError, match="must lie in constraints.lower_cholesky"
    ):
        eqx.filter_jit(ep.lower_cholesky)(upper)
    with pytest.raises(eqx.EquinoxRuntimeError, match="ep.positive"):
        jax.vmap(ep.positive)(jnp.array([1.0, -1.0]))
    with pytest.raises(eqx.EquinoxRuntimeError, match="outside the range"):
        eqx.filter_jit(ep.Bijector.from_value)(jnp.array(-1.0), tfb.Softplus())


# ---------------------------------------------------------------- paramax


def test_paramax_wrappers_resolve_and_non_trainable_stays_frozen():
    paramax = pytest.importorskip("paramax")
    model = {
        "frozen": paramax.non_trainable(jnp.array(0.7)),
        "scale": paramax.Parameterize(jnp.exp, jnp.array(0.0)),
        "ours": ep.positive(2.0),
    }
    values = ep.resolve(model)
    np.testing.assert_allclose(values["frozen"], 0.7)
    np.testing.assert_allclose(values["scale"], 1.0)
    np.testing.assert_allclose(values["ours"], 2.0, rtol=1e-6)
    spec = ep.trainable(model)
    assert not any(jtu.tree_leaves(spec["frozen"]))
    # adamw with weight decay: the paramax-frozen value must not move
    trained, _ = ep.fit(
        model,
        lambda m: (
            jnp.sum(ep.resolve(m)["scale"] - 2.0) ** 2 + 0 * ep.resolve(m)["frozen"]
        ),
        optimiser=optax.adamw(0.1, weight_decay=0.5),
        steps=50,
        progress=False,
    )
    np.testing.assert_allclose(paramax.unwrap(trained["frozen"]), 0.7)
    assert ep.resolve(trained)["scale"] != 1.0  # the trainable part moved


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_node_shows_its_constrained_value_in_repr_and_treescope(dtype):
    # The value a user set (not the unconstrained number), to six significant
    # digits, and the transform; the same in treescope.
    with jax.enable_x64(dtype == jnp.float64):
        node = ep.positive(jnp.asarray(0.1, dtype))
        tree = {"s": node, "b": ep.bounded(jnp.asarray([0.2, 0.4], dtype), 0.0, 1.0)}
        assert repr(node) == "Bijector(0.1, softplus)"
        assert eqx.tree_pformat(tree["b"]) == "Bijector([0.2, 0.4], sigmoid(0.0, 1.0))"
        treescope = pytest.importorskip("treescope")
        text = treescope.render_to_text(tree)
        assert "value=" in text and "'softplus'" in text and "param=" not in text
        shown = float(text.split("value=<jax.Array(")[1].split(",")[0])
        assert shown == pytest.approx(0.1, rel=1e-6)
        # A filter spec (no array) shows its fields.
        assert "param=True" in treescope.render_to_text(ep.trainable(tree)["s"])
