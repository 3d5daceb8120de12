"""`ep.fit` trains what the code says at each call: every way of changing what a
loss or optimiser reads between two calls gives the result of `jax.jit` on the
function as it is then (a hand-written `lax.scan`), through the same loss object
and through a fresh one; and equal code traced again compiles nothing."""

import array
import collections
import contextlib
import functools
import gc
import os
import types
import weakref
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _compiles import Compilations
from _processes import on_8_devices, run_python

import eqxprob as ep


STEPS = 40


def _reference(loss, optimiser=None, x0=None):
    """`jax.jit` of a fresh `lax.scan` over the loss as it is now."""
    optimiser = optimiser or optax.sgd(0.1)
    x0 = jnp.zeros(2) if x0 is None else x0

    @jax.jit
    def run(x):
        def body(carry, _):
            x, state = carry
            value, grads = jax.value_and_grad(lambda y: loss(y))(x)
            with jax.numpy_dtype_promotion("standard"):
                updates, state = optimiser.update(grads, state, x)
                return (optax.apply_updates(x, updates), state), value

        with jax.numpy_dtype_promotion("standard"):
            state = optimiser.init(x)
        return jax.lax.scan(body, (x, state), None, length=STEPS)

    (x, _), losses = run(x0)
    return x, losses


def _check(loss, optimiser=None):
    x, losses = ep.fit(
        jnp.zeros(2),
        loss,
        optimiser=optimiser or optax.sgd(0.1),
        steps=STEPS,
        progress=False,
    )
    ref_x, ref_losses = _reference(loss, optimiser)
    np.testing.assert_allclose(x, ref_x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    return x


def _quadratic(x, target):
    return jnp.sum((x - target) ** 2)


G = 1.0


def _reads_global(x):
    return _quadratic(x, G)


def _reads_globals_dict(x):
    return _quadratic(x, globals()["G"])


class _Slotted:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


class _Config:
    t = 1.0


class _Int(int):
    pass


def _seven_deep(t: float) -> dict[str, Any]:
    node: dict[str, Any] = {"t": t}
    for _ in range(20):
        node = {"next": node}
    return node


@functools.wraps(jnp.sum)
def _wrapped_like_library(x):
    return _quadratic(x, G)


HELPERS = types.ModuleType("helpers")
HELPERS.target = lambda: 1.0  # pyright: ignore[reportAttributeAccessIssue]


def _via_helper_module(x):
    return _quadratic(x, HELPERS.target())


def _set_global(value):
    global G
    G = value


CASES = {}


def _case(fn):
    CASES[fn.__name__] = fn
    return fn


@_case
def rebound_global():
    _check(_reads_global)
    _set_global(3.0)
    return _check(_reads_global)


@_case
def global_read_through_globals_dict():
    _check(_reads_globals_dict)
    _set_global(-2.0)
    return _check(_reads_globals_dict)


@_case
def attribute_read_by_getattr_with_a_string():
    obj = types.SimpleNamespace(k=1.0)
    name = "k"
    loss = lambda x: _quadratic(x, getattr(obj, name))  # noqa: E731
    _check(loss)
    obj.k = 4.0
    return _check(loss)


@_case
def slots_attribute():
    obj = _Slotted(1.0)
    loss = lambda x: _quadratic(x, obj.t)  # noqa: E731
    _check(loss)
    obj.t = 2.5
    return _check(loss)


@_case
def containers_mutated_in_place():
    targets, queue, arr = {1.0}, collections.deque([1.0]), array.array("d", [1.0])
    loss = lambda x: _quadratic(x, max(targets) + queue[0] + arr[0])  # noqa: E731
    _check(loss)
    targets.add(2.0)
    queue.appendleft(-1.0)
    arr[0] = 0.5
    return _check(loss)


@_case
def class_attribute():
    loss = lambda x: _quadratic(x, _Config.t)  # noqa: E731
    _check(loss)
    _Config.t = -3.0
    return _check(loss)


@_case
def function_attribute():
    def loss(x):
        return _quadratic(x, loss.k)  # pyright: ignore[reportFunctionMemberAccess]

    loss.k = 1.0  # pyright: ignore[reportFunctionMemberAccess]
    _check(loss)
    loss.k = 2.0  # pyright: ignore[reportFunctionMemberAccess]
    return _check(loss)


@_case
def attribute_of_an_int_subclass():
    n = _Int(2)
    n.scale = 1.0  # pyright: ignore[reportAttributeAccessIssue]
    loss = lambda x: _quadratic(x, n * n.scale)  # pyright: ignore  # noqa: E731
    _check(loss)
    n.scale = 0.25  # pyright: ignore[reportAttributeAccessIssue]
    return _check(loss)


@_case
def c_object_state():
    bits = np.random.PCG64(0)
    rng = np.random.Generator(bits)  # (`np.random.default_rng(0)`)
    state = rng.bit_generator.state
    loss = lambda x: _quadratic(x, rng.uniform())  # noqa: E731
    _check_reseeded = lambda: (  # noqa: E731
        setattr(rng.bit_generator, "state", state),
        ep.fit(
            jnp.zeros(2), loss, optimiser=optax.sgd(0.1), steps=STEPS, progress=False
        ),  # fmt: skip
        setattr(rng.bit_generator, "state", state),
        _reference(loss),
    )
    _, (x, _), _, (ref, _) = _check_reseeded()
    np.testing.assert_allclose(x, ref, rtol=1e-5)
    bits.advance(5)
    state = rng.bit_generator.state
    _, (x, _), _, (ref, _) = _check_reseeded()
    np.testing.assert_allclose(x, ref, rtol=1e-5)
    return x


@_case
def user_function_wrapped_to_look_like_a_library_one():
    _set_global(1.0)
    _check(_wrapped_like_library)
    _set_global(6.0)
    return _check(_wrapped_like_library)


@_case
def state_deeper_than_any_walk():
    tree = _seven_deep(1.0)

    def loss(x):
        node = tree
        while "next" in node:
            node = node["next"]
        return _quadratic(x, node["t"])

    _check(loss)
    node = tree
    while "next" in node:
        node = node["next"]
    node["t"] = -1.5
    return _check(loss)


@_case
def helper_module_function_monkeypatched():
    HELPERS.target = lambda: 1.0  # pyright: ignore[reportAttributeAccessIssue]
    _check(_via_helper_module)
    HELPERS.target = lambda: 2.0  # pyright: ignore[reportAttributeAccessIssue]
    return _check(_via_helper_module)


@_case
def fresh_function_from_the_same_expression():
    out = None
    for target in (1.0, 2.0):
        out = _check(lambda x, t=target: _quadratic(x, t))
    return out


@_case
def numpy_array_mutated_in_place():
    target = np.ones(2)
    loss = lambda x: _quadratic(x, target)  # noqa: E731
    _check(loss)
    target[:] = [3.0, -1.0]
    return _check(loss)


@_case
def optimiser_reading_a_mutable_schedule():
    rates = [0.1]
    schedule = lambda count: rates[0]  # noqa: E731
    optimiser = optax.sgd(schedule)
    loss = lambda x: _quadratic(x, 1.0)  # noqa: E731
    _check(loss, optimiser)
    rates[0] = 0.01
    return _check(loss, optimiser)


@_case
def host_callback_reading_a_global():
    # A host callback is named by index in the lowered text: never reused.
    scale = [1.0]

    def target(x):
        shape = jax.ShapeDtypeStruct((), jnp.float32)
        return jax.pure_callback(lambda: np.float32(scale[0]), shape)

    loss = lambda x: _quadratic(x, target(x))  # noqa: E731
    _check(loss)
    scale[0] = 2.0
    return _check(loss)


@_case
def static_field_of_an_equinox_loss():
    class Loss(eqx.Module):
        t: float = eqx.field(static=True)

        def __call__(self, x):
            return _quadratic(x, self.t)

    _check(Loss(1.0))
    return _check(Loss(-4.0))


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_fit_trains_what_the_loss_reads_now(name):
    old = G
    try:
        CASES[name]()
    finally:
        _set_global(old)


def test_equal_code_traced_again_compiles_nothing():
    """The same loss object, a fresh equal lambda and a fresh equal optimiser:
    identical programs, one compile in all; another target compiles anew."""

    def run(loss, rate=0.1):
        return ep.fit(
            jnp.zeros(2), loss, optimiser=optax.adam(rate), steps=17, progress=False
        )

    loss = lambda x: _quadratic(x, 0.375)  # noqa: E731
    run(loss)
    with Compilations() as c:
        run(loss)
        run(lambda x: _quadratic(x, 0.375))
        run(loss, rate=0.1)
    assert c.count == 0
    with Compilations() as c:  # (a Python float: a literal of the program)
        x, _ = run(lambda x: _quadratic(x, 0.625))
    assert c.count >= 1
    np.testing.assert_allclose(x, [0.625, 0.625], atol=0.2)


@pytest.mark.parametrize(
    "name, value",
    [
        ("jax_disable_most_optimizations", True),
        ("jax_exec_time_optimization_effort", -0.5),
        ("jax_compiler_enable_remat_pass", False),
    ],
)
def test_a_setting_of_how_xla_compiles_compiles_its_own_program(name, value):
    """Settings that change how XLA compiles an identical text (its options,
    not the lowering): a program compiled under the old setting is not reused,
    and a call back under it reuses its own."""

    def run():
        loss = lambda x: _quadratic(x, 0.25)  # noqa: E731
        return ep.fit(
            jnp.zeros(2), loss, optimiser=optax.sgd(0.1), steps=6, progress=False
        )

    run()
    before = jax.config.values[name]
    try:
        jax.config.update(name, value)
        with Compilations() as c:
            x, _ = run()
        assert c.count >= 1
    finally:
        jax.config.update(name, before)
    with Compilations() as c:
        y, _ = run()
    assert c.count == 0
    np.testing.assert_allclose(x, y, rtol=1e-6)


def test_a_vmap_over_a_value_the_loss_reads_is_the_loop_of_fits():
    targets = jnp.array([1.0, -2.0, 0.5])
    fit = lambda t: ep.fit(  # noqa: E731
        jnp.zeros(2),
        lambda x: _quadratic(x, t),
        optimiser=optax.sgd(0.1),
        steps=STEPS,
        progress=False,
    )[0]
    batched = jax.vmap(fit)(targets)
    for t, x in zip(targets, batched):
        np.testing.assert_allclose(
            x, _reference(lambda y, t=t: _quadratic(y, t))[0], rtol=1e-5
        )


@pytest.mark.slow
def test_the_loss_is_traced_once_a_call_eagerly_and_under_a_transformation():
    """A loss that reads changing state while traced (a counter here, a NumPy
    draw in practice) is traced once a call, as by `jax.jit` of a fresh
    function: also when it closes over a value of an outer `jax.jit` or
    `jax.vmap`, and with an optimiser that re-evaluates it (L-BFGS)."""
    traces = []

    def loss_for(t):
        def loss(x):
            traces.append(1)
            return _quadratic(x, t)

        return loss

    def fit(t, optimiser=None):
        return ep.fit(
            jnp.zeros(2), loss_for(t), optimiser=optimiser or optax.sgd(0.1),
            steps=STEPS, progress=False,
        )[0]  # fmt: skip

    for run in (
        lambda: fit(1.0),
        lambda: fit(1.0, optax.lbfgs()),
        lambda: jax.jit(fit)(1.0),
        lambda: jax.vmap(fit)(jnp.array([1.0, 2.0])),
        lambda: jax.vmap(lambda t: fit(t, optax.lbfgs()))(jnp.array([1.0, 2.0])),
    ):
        traces.clear()
        run()
        assert len(traces) == 1


@pytest.mark.parametrize(
    "dtype, optimiser",
    [
        (jnp.bfloat16, optax.adamw(1e-2, mu_dtype=jnp.float32)),
        (jnp.float16, optax.sgd(np.float32(0.05))),  # pyright: ignore[reportArgumentType]  (NumPy's float32: the point)
        (jnp.bfloat16, optax.sgd(jnp.float32(0.05))),
    ],
    ids=["bf16-mu-f32", "f16-lr-f32", "bf16-lr-f32"],
)
def test_updates_in_another_dtype_keep_the_parameters_dtype(dtype, optimiser):
    """As `optax.apply_updates`: the parameters keep their dtype."""
    x0 = jnp.zeros(4, dtype)
    loss = lambda x: jnp.sum((x.astype(jnp.float32) - 2.0) ** 2)  # noqa: E731
    x, losses = ep.fit(x0, loss, optimiser=optimiser, steps=STEPS, progress=False)
    ref, ref_losses = _reference(loss, optimiser, x0)
    assert x.dtype == dtype
    np.testing.assert_array_equal(
        np.asarray(x, np.float32), np.asarray(ref, np.float32)
    )
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)


def test_a_float64_learning_rate_on_float32_parameters():
    with jax.enable_x64(True):
        optimiser = optax.adam(np.logspace(-3, -1, 5)[3])
        x0 = jnp.zeros(2, jnp.float32)
        loss = lambda x: _quadratic(x, 1.0)  # noqa: E731
        x, _ = ep.fit(x0, loss, optimiser=optimiser, steps=STEPS, progress=False)
        ref, _ = _reference(loss, optimiser, x0)
        assert x.dtype == jnp.float32
        np.testing.assert_allclose(x, ref, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.standard_promotion("optax's line search mixes float32 and float64")
def test_a_line_search_in_another_precision_evaluates_the_one_trace():
    """optax's L-BFGS line search evaluates the loss at `params + step * updates`,
    which float64 steps promote: the loss's one trace evaluates those in the
    parameters' dtype (float32), rather than failing, and trains as optax does
    with the float64 loss, to float32 rounding."""
    with jax.enable_x64(True):
        loss = lambda x: _quadratic(x, 3.0)  # noqa: E731
        x0 = jnp.zeros(2, jnp.float32)
        optimiser = optax.lbfgs()
        x, _ = ep.fit(x0, loss, optimiser=optimiser, steps=5, progress=False)

        def body(carry, _):
            y, state = carry
            value, grad = jax.value_and_grad(loss)(y)
            updates, state = optimiser.update(
                grad, state, y, value=value, grad=grad, value_fn=loss
            )
            return (optax.apply_updates(y, updates), state), value

        (ref, _), _ = jax.lax.scan(body, (x0, optimiser.init(x0)), None, length=5)
        assert x.dtype == jnp.float32
        np.testing.assert_allclose(x, np.asarray(ref), rtol=1e-6)


def test_fit_of_concrete_values_inside_a_traced_function():
    """Called inside `jax.jit`, `lax.scan` or `eqx.filter_jit` on values it
    closes over (no tracer among its arguments), `fit` is part of that trace."""
    x0, loss = jnp.zeros(2), lambda x: _quadratic(x, 3.0)  # noqa: E731
    state = ep.FitState.init(x0, optax.adam(0.1))

    def fit(t):
        x, _ = ep.fit(x0, loss, optimiser=optax.adam(0.1), steps=STEPS,
                      progress=False, state=state)  # fmt: skip
        return x + t

    eager = fit(0.0)
    np.testing.assert_allclose(jax.jit(fit)(0.0), eager, rtol=1e-6)
    np.testing.assert_allclose(eqx.filter_jit(lambda: fit(0.0))(), eager, rtol=1e-6)
    _, ys = jax.lax.scan(lambda c, t: (c, fit(t)), 0.0, jnp.zeros(2))
    np.testing.assert_allclose(ys[1], eager, rtol=1e-6)


def _sgd_fit(x0, loss, steps=30):
    x, _ = ep.fit(x0, loss, optimiser=optax.sgd(0.1), steps=steps, progress=False)
    return x


def _twice(context):
    """Fit a loss closing over `W`, overwrite `W`, then fit another loss closing
    over `V`, equal to `W` as it was, under `context` (which JAX keys its own
    caches by): the second fit trains on `V`, whatever the first left behind."""
    W = np.zeros(3, np.float32)
    np.testing.assert_allclose(
        _sgd_fit(jnp.ones(3), lambda p: jnp.sum((p - W) ** 2)), 0.0, atol=2e-3
    )
    W[:] = 5.0
    V = np.zeros(3, np.float32)
    with context():
        x = _sgd_fit(jnp.ones(3), lambda p: jnp.sum((p - V) ** 2))
    np.testing.assert_allclose(x, 0.0, atol=2e-3)


@pytest.mark.parametrize(
    "context",
    [
        lambda: jax.numpy_rank_promotion("warn"),
        lambda: jax.default_matmul_precision("highest"),
        lambda: jax.debug_key_reuse(True),
        lambda: jax.numpy_dtype_promotion("standard"),
    ],
    ids=["rank_promotion", "matmul_precision", "debug_key_reuse", "dtype_promotion"],
)
def test_a_matched_program_runs_on_this_calls_data_in_any_jax_context(context):
    """The repro of issue #44: a program matched under another JAX context (a
    miss of JAX's own cache) once retraced the first loss's jaxpr, reading its
    NumPy buffer as it was then overwritten (it trained to 5.0, not -1.0)."""
    _twice(context)


def test_a_fixed_leaf_weak_in_one_call_and_strong_in_the_next():
    """A non-trained leaf weakly typed in one call (`jnp.asarray(1)`) and not in
    the next (`jnp.int32(1)`), the loss closing over equal arrays: each call
    trains on its own array (the old cache retraced the first one's)."""

    def fit(n, target):
        model = {"x": jnp.zeros(2), "n": n}
        loss = lambda m: jnp.sum((m["x"] * m["n"].astype(jnp.float32) - target) ** 2)
        x, _ = ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=50, progress=False)
        return x["x"]

    W = np.zeros(2, np.float32)
    np.testing.assert_allclose(fit(jnp.asarray(1), W), 0.0, atol=1e-4)
    W[:] = 5.0
    np.testing.assert_allclose(
        fit(jnp.int32(1), np.zeros(2, np.float32)), 0.0, atol=1e-4
    )


@pytest.mark.parametrize("how", ["deleted", "donated"])
def test_an_array_deleted_or_donated_after_its_fit_breaks_no_later_fit(how):
    """The cache holds no user array: a program compiled for a loss whose array
    was since deleted (or donated to another computation) runs later fits on
    their own arrays, under another JAX context too."""
    W = jnp.full(3, 2.0)
    _sgd_fit(jnp.ones(3), lambda p: jnp.sum((p - W) ** 2))
    if how == "deleted":
        W.delete()
    else:
        jax.jit(lambda w: w + 1.0, donate_argnums=0)(W)
    V = jnp.full(3, 2.0)  # (equal to `W` as it was: the same program)
    for context in (contextlib.nullcontext, lambda: jax.numpy_rank_promotion("warn")):
        with context():
            x = _sgd_fit(jnp.ones(3), lambda p: jnp.sum((p - V) ** 2))
        np.testing.assert_allclose(x, 2.0, atol=3e-3)


@pytest.mark.parametrize("kind", ["jax", "numpy"])
def test_an_array_the_loss_closed_over_is_freed_after_the_fit(kind):
    """Nothing `fit` keeps (its compiled programs) references an array the loss
    closed over: once the caller drops it, it is gone (a 4 MB array was pinned
    until 32 newer programs pushed it out)."""

    def loss_closing_over_a_big_array():
        big = jnp.ones(1_000_000) if kind == "jax" else np.ones(1_000_000, np.float32)
        return weakref.ref(big), lambda p: jnp.sum((p - big[:3]) ** 2) + jnp.sum(big)

    gone, loss = loss_closing_over_a_big_array()
    _sgd_fit(jnp.zeros(3), loss)
    del loss
    gc.collect()
    assert gone() is None


def test_a_closed_over_array_is_data_not_part_of_the_program():
    """Closing over 2,000,000 floats compiles nothing once 2,000 of the same
    shape... and other values of the same shape compile nothing: the values
    are inputs, never written into the program (nor its key)."""
    data = np.random.default_rng(0).normal(size=2_000_000).astype(np.float32)
    loss = lambda p, d: jnp.sum((p - jnp.mean(d)) ** 2)  # noqa: E731
    _sgd_fit(jnp.zeros(2), lambda p: loss(p, data), steps=200)
    with Compilations() as c:
        for shift in (1.0, -3.0):
            moved = data + shift
            x = _sgd_fit(jnp.zeros(2), lambda p, d=moved: loss(p, d), steps=200)
            np.testing.assert_allclose(x, np.mean(moved), atol=1e-3)
    assert c.count == 0


def test_losses_reading_different_unused_leaves_train_on_their_own():
    """Two losses whose programs differ only in which of several equal-typed
    inputs they read (a non-trained leaf of the model, a leaf of `data`): each
    trains on the one it reads. (`jax.jit` drops unused inputs, and the two
    texts were then the same: the second fit ran on the first one's choice.)"""
    model = {"x": jnp.zeros(2), "a": jnp.array([1, 1]), "b": jnp.array([5, 5])}
    for name, target in [("a", 1.0), ("b", 5.0)]:
        loss = lambda m, name=name: jnp.sum((m["x"] - m[name].astype(float)) ** 2)
        fitted, _ = ep.fit(
            model, loss, optimiser=optax.sgd(0.1), steps=50, progress=False
        )
        np.testing.assert_allclose(fitted["x"], target, rtol=1e-4)
    data = {"u": jnp.full((4, 2), 2.0), "v": jnp.full((4, 2), -3.0)}
    for name, target in [("u", 2.0), ("v", -3.0)]:
        loss = lambda x, d, name=name: jnp.sum((x - d[name].mean(0)) ** 2)
        x, _ = ep.fit(
            jnp.zeros(2), loss, optimiser=optax.sgd(0.1), steps=50, progress=False,
            data=data,
        )  # fmt: skip
        np.testing.assert_allclose(x, target, rtol=1e-4)


@pytest.mark.parametrize("size", [2, 300_000])
def test_a_loss_closing_over_a_mutable_array_reads_that_array(size):
    """A `jax.new_ref` the loss closes over (JAX passes it to the program
    itself): each fit reads its own, small or over 1 MiB, and keeps none."""

    def fit(target):
        ref = jax.new_ref(jnp.full(size, target))
        loss = lambda x: jnp.sum((x - jnp.mean(ref[...])) ** 2)  # noqa: E731
        return weakref.ref(ref), _sgd_fit(jnp.zeros(2), loss, steps=60)

    for target in (1.0, 7.0):
        gone, x = fit(target)
        np.testing.assert_allclose(x, target, rtol=1e-3)
        gc.collect()
        assert gone() is None


def test_constants_jax_binds_into_the_executable_are_not_reused():
    """With `JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=1` JAX makes the constants of a
    trace inputs it binds into the executable, outside the text: each fit still
    trains on its own constant, and none is kept after it."""
    code = """if True:
        import gc, weakref
        import jax, jax.numpy as jnp, optax
        import eqxprob as ep
        assert jax.config.values["jax_use_simplified_jaxpr_constants"]
        def fit(W):
            loss = lambda x: jnp.sum((x - W[:2]) ** 2)
            x, _ = ep.fit(jnp.zeros(2), loss, optimiser=optax.sgd(0.1), steps=60,
                          progress=False)
            return x
        first = jnp.full(16, 1.0)
        gone = weakref.ref(first)
        print(fit(first)[0], end=" ")
        del first
        gc.collect()
        print(gone() is None, fit(jnp.full(16, 5.0))[0])
    """
    env = {**os.environ, "JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS": "1"}
    one, freed, five = run_python("-c", code, env=env).stdout.split()
    assert abs(float(one) - 1.0) < 1e-3 and abs(float(five) - 5.0) < 1e-3
    assert freed == "True"


def test_placements_on_other_devices_compile_their_own_programs():
    """Data sharded over meshes of the same shape on other devices (or the same
    devices in another order) run each on its own mesh, and a constant over
    1 MiB committed to one device beside parameters on another trains as
    `jax.jit` of the step would (the devices' ids are part of the key)."""
    code = """if True:
        import jax, jax.numpy as jnp, numpy as np, optax
        from jax.sharding import NamedSharding, PartitionSpec as P
        import eqxprob as ep
        devices = jax.devices()
        def run(order, target):
            mesh = jax.sharding.Mesh(np.array([devices[i] for i in order]), ("x",))
            data = jax.device_put(jnp.full((8, 2), target), NamedSharding(mesh, P("x")))
            x0 = jax.device_put(jnp.zeros(2), NamedSharding(mesh, P()))
            loss = lambda x, d: jnp.sum((x - d.mean(0)) ** 2)
            x, _ = ep.fit(x0, loss, optimiser=optax.sgd(0.1), steps=40,
                          progress=False, data=data)
            return float(x[0])
        cases = [((0, 1), 1.0), ((1, 0), 3.0), ((2, 3), 5.0)]
        print(*[run(order, target) for order, target in cases])
        for n in (1000, 300_000):
            big = jax.device_put(jnp.full(n, 2.0), devices[1])
            x0 = jax.device_put(jnp.zeros(2), devices[0])
            loss = lambda x: jnp.sum((x - jnp.mean(big)) ** 2)
            x, _ = ep.fit(x0, loss, optimiser=optax.sgd(0.1), steps=60, progress=False)
            print(float(x[0]))
    """
    values = [float(v) for v in on_8_devices(code).stdout.split()]
    np.testing.assert_allclose(values, [1.0, 3.0, 5.0, 2.0, 2.0], rtol=2e-3)


def test_a_mesh_the_loss_names_runs_on_its_own_devices():
    """Parameters on no device of their own and a loss that shards over a mesh
    it names: each fit runs on that mesh's devices, as `jax.jit` would (the
    text holds a mesh's shape, not its devices), and under `jax.set_mesh` a
    chunk whose outputs come back sharded runs the next chunk on them."""
    code = """if True:
        import jax, jax.numpy as jnp, numpy as np, optax
        from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
        import eqxprob as ep
        d = jax.devices()
        for ids in [(0, 1), (2, 3)]:
            s = NamedSharding(Mesh(np.array([d[i] for i in ids]), ("x",)), P("x"))
            loss = lambda x: jnp.sum((jax.lax.with_sharding_constraint(x, s) - 2) ** 2)
            x, _ = ep.fit(jnp.zeros(4), loss, optimiser=optax.sgd(0.1), steps=20,
                          progress=False)
            print(float(x[0]), *sorted(e.id for e in x.devices()))
        mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
        loss = lambda x: jnp.sum((jax.sharding.reshard(x, P("x")) - 2.0) ** 2)
        with jax.set_mesh(mesh):
            x, _ = ep.fit(np.zeros(4, np.float32), loss, optimiser=optax.sgd(0.1),
                          steps=20, progress=False)
        print(float(x[0]))
    """
    lines = [line.split() for line in on_8_devices(code).stdout.splitlines()]
    assert [line[1:] for line in lines[:2]] == [["0", "1"], ["2", "3"]]
    values = [float(line[0]) for line in lines]
    np.testing.assert_allclose(values, [2 * (1 - 0.8**20)] * 3, rtol=1e-4)
