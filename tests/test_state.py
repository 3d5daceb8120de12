import re
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax import lax

import eqxprob as ep


# ---------------------------------------------------------------- test modules


class Accumulator(eqx.Module):
    """State adds `x` on every call; the output is `scale * state`."""

    index: eqx.nn.StateIndex
    scale: float = eqx.field(static=True)

    def __init__(self, scale: float = 2.0, size: int = 3):
        self.index = eqx.nn.StateIndex(jnp.zeros(size))
        self.scale = scale

    def __call__(self, x, state):
        total = state.get(self.index) + x
        return self.scale * total, state.set(self.index, total)


class Bank(eqx.Module):
    """A list of accumulators: several `StateIndex`es one level down."""

    accumulators: list

    def __init__(self):
        self.accumulators = [Accumulator(scale=float(i + 1)) for i in range(3)]

    def __call__(self, x, state):
        out = jnp.zeros_like(x)
        for acc in self.accumulators:
            y, state = acc(x, state)
            out = out + y
        return out, state


class Deep(eqx.Module):
    """A module inside a module, with state at three depths."""

    bank: Bank
    counter: eqx.nn.StateIndex

    def __init__(self):
        self.bank = Bank()
        self.counter = eqx.nn.StateIndex(jnp.array(0, dtype=jnp.int32))

    def __call__(self, x, state):
        count = state.get(self.counter) + 1
        state = state.set(self.counter, count)
        y, state = self.bank(x, state)
        return y + count.astype(y.dtype), state


def nested_indices(deep: Deep) -> list:
    return [deep.counter] + [a.index for a in deep.bank.accumulators]


X = jnp.array([1.0, 2.0, 3.0])
EVENT_STEPS = (3, 7)


def make(module, x: Any = X, **kwargs):
    return eqx.nn.make_with_state(ep.UpdateOnEvent)(module, x, **kwargs)


@eqx.filter_jit
def jitted_call(model, event, x, state):
    return model(event, x, state)


def run_python_loop(model, state, events, x=X, jit=True):
    outputs = []
    for event in events:
        call = jitted_call if jit else lambda m, *args: m(*args)
        out, state = call(model, event, x, state)
        outputs.append(out)
    return jnp.stack(outputs), state


def cond_count(jaxpr) -> int:
    return len(re.findall(r"\bcond\[", str(jaxpr)))


# ---------------------------------------------------------------- the scenario


def test_events_at_3_and_7():
    model, state = make(Accumulator())
    events = [step in EVENT_STEPS for step in range(10)]
    outputs, _ = run_python_loop(
        model, state, [jnp.array(e) for e in events], jit=False
    )
    assert jnp.all(jnp.isnan(outputs[:3]))
    np.testing.assert_allclose(outputs[3:7], jnp.broadcast_to(2 * X, (4, 3)))
    np.testing.assert_allclose(outputs[7:], jnp.broadcast_to(4 * X, (3, 3)))


def test_always_true_equals_unwrapped():
    model, state = make(Accumulator())
    bare, bare_state = eqx.nn.make_with_state(Accumulator)()
    for _ in range(10):
        out, state = jitted_call(model, jnp.array(True), X, state)
        expected, bare_state = bare(X, bare_state)
        np.testing.assert_array_equal(out, expected)


def test_events_under_scan_and_jit():
    model, state = make(Accumulator())
    events = jnp.array([step in EVENT_STEPS for step in range(10)])

    @eqx.filter_jit
    def run(model, state, events):
        def step(state, event):
            out, state = model(event, X, state)
            return state, out

        return lax.scan(step, state, events)

    final_state, outputs = run(model, state, events)
    expected, expected_state = run_python_loop(model, state, list(events))
    np.testing.assert_array_equal(outputs, expected)
    assert jnp.all(jnp.isnan(outputs[:3]))
    np.testing.assert_allclose(outputs[7:], jnp.broadcast_to(4 * X, (3, 3)))
    np.testing.assert_array_equal(
        final_state.get(model.module.index), expected_state.get(model.module.index)
    )


def test_python_bool_events():
    model, state = make(Accumulator())
    events = [step in EVENT_STEPS for step in range(10)]
    outputs, _ = run_python_loop(model, state, events)
    assert jnp.all(jnp.isnan(outputs[:3]))
    np.testing.assert_allclose(outputs[3:7], jnp.broadcast_to(2 * X, (4, 3)))
    np.testing.assert_allclose(outputs[7:], jnp.broadcast_to(4 * X, (3, 3)))


# ---------------------------------------------------------------- nested state


def test_nested_state_frozen_and_advanced():
    model, state = make(Deep())
    bare, bare_state = eqx.nn.make_with_state(Deep)()
    previous = None
    for step in range(10):
        event = step % 3 == 1
        before = jtu.tree_leaves(state)
        out, state = jitted_call(model, jnp.array(event), X, state)
        if event:
            previous, bare_state = bare(X, bare_state)
        else:
            # Every nested state, and the stored output, is untouched.
            for a, b in zip(before, jtu.tree_leaves(state), strict=True):
                np.testing.assert_array_equal(a, b)
        for mine, ref in zip(nested_indices(model.module), nested_indices(bare)):
            np.testing.assert_array_equal(state.get(mine), bare_state.get(ref))
        if previous is None:
            assert jnp.all(jnp.isnan(out))
        else:
            np.testing.assert_array_equal(out, previous)
    # Sanity: three events happened, so every state moved three times.
    assert state.get(model.module.counter) == 3
    np.testing.assert_allclose(
        state.get(model.module.bank.accumulators[2].index), 3 * X
    )


def test_nested_state_under_vmap():
    model, state = make(Deep())
    batch = 4
    events = jnp.array([True, False, True, False])
    xs = jnp.arange(batch * 3, dtype=jnp.float32).reshape(batch, 3)
    states = jtu.tree_map(lambda a: jnp.broadcast_to(a, (batch, *a.shape)), state)
    vmapped = jax.vmap(model)
    for _ in range(3):
        outs, states = vmapped(events, xs, states)
        events = ~events  # alternate which members fire
    # Reference: each batch member driven on its own with scalar events.
    for i in range(batch):
        member_state = jtu.tree_map(lambda a, i=i: a[i], states)
        _, ref_state = make(Deep())
        ev = bool(i % 2 == 0)
        for _ in range(3):
            ref_out, ref_state = model(ev, xs[i], ref_state)
            ev = not ev
        np.testing.assert_array_equal(outs[i], ref_out)  # pyright: ignore[reportPossiblyUnboundVariable]  (the loops run)
        for a, b in zip(jtu.tree_leaves(member_state), jtu.tree_leaves(ref_state)):
            np.testing.assert_array_equal(a, b)
    # Batched events become a select: no `cond` survives.
    jaxpr = jax.make_jaxpr(vmapped)(events, xs, states)
    assert cond_count(jaxpr) == 0
    assert "select_n" in str(jaxpr)


def test_nested_update_on_event_direct():
    inner = ep.UpdateOnEvent(Accumulator(), X)
    model, state = make(inner, x=(True, X))
    outputs = []
    table = [(False, True), (True, False), (True, True), (False, True), (True, True)]
    for outer_event, inner_event in table:
        inputs = (jnp.array(inner_event), X)
        out, state = jitted_call(model, jnp.array(outer_event), inputs, state)
        outputs.append(out)
    # Step 0: outer false -> nan. Step 1: outer true, inner false -> inner's nan.
    assert jnp.all(jnp.isnan(outputs[0])) and jnp.all(jnp.isnan(outputs[1]))
    np.testing.assert_allclose(outputs[2], 2 * X)  # first real update
    np.testing.assert_allclose(outputs[3], 2 * X)  # outer frozen
    np.testing.assert_allclose(outputs[4], 4 * X)  # second real update
    np.testing.assert_allclose(state.get(model.module.module.index), 2 * X)


class TwoClocks(eqx.Module):
    """A module holding two `UpdateOnEvent`s with different schedules."""

    fast: ep.UpdateOnEvent
    slow: ep.UpdateOnEvent

    def __init__(self):
        self.fast = ep.UpdateOnEvent(Accumulator(scale=1.0), X)
        self.slow = ep.UpdateOnEvent(Accumulator(scale=1.0), X)

    def __call__(self, x, state):
        step, x = x
        fast, state = self.fast(jnp.array(True), x, state)
        slow, state = self.slow(step % 2 == 0, x, state)
        return {"fast": fast, "slow": slow}, state


def test_nested_update_on_event_inside_module():
    model, state = make(TwoClocks(), x=(jnp.array(0), X))

    @eqx.filter_jit
    def step(model, state, event, i):
        return model(event, (i, X), state)

    outs = []
    for i in range(6):
        out, state = step(model, state, jnp.array(i < 4), jnp.array(i))
        outs.append(out)
    # Outer fires on steps 0-3: fast runs 4 times, slow on steps 0 and 2.
    np.testing.assert_allclose(outs[3]["fast"], 4 * X)
    np.testing.assert_allclose(outs[3]["slow"], 2 * X)
    np.testing.assert_allclose(outs[5]["fast"], 4 * X)
    np.testing.assert_allclose(state.get(model.module.slow.module.index), 2 * X)


# ---------------------------------------------------------------- transforms


def test_cond_skips_work_for_scalar_events():
    model, state = make(Accumulator())
    jaxpr = jax.make_jaxpr(lambda e, s: model(e, X, s))(jnp.array(True), state)
    assert cond_count(jaxpr) == 1
    # A Python bool is resolved at trace time: no cond at all.
    for event in (True, False):
        jaxpr = jax.make_jaxpr(lambda s, e=event: model(e, X, s))(state)
        assert cond_count(jaxpr) == 0


def test_inner_module_runs_only_on_events():
    calls = []

    class Logged(eqx.Module):
        inner: Accumulator

        def __call__(self, x, state):
            jax.debug.callback(lambda: calls.append(1))
            return self.inner(x, state)

    model, state = make(Logged(Accumulator()))
    events = jnp.array([step in EVENT_STEPS for step in range(10)])

    @jax.jit
    def run(state, events):
        def body(s, e):
            out, s = model(e, X, s)
            return s, out

        return lax.scan(body, state, events)

    jax.block_until_ready(run(state, events))
    jax.effects_barrier()
    assert len(calls) == len(EVENT_STEPS)


def test_traced_event_compiles_once():
    traces = []
    model, state = make(Accumulator())

    @eqx.filter_jit
    def step(model, event, state):
        traces.append(1)
        return model(event, X, state)

    for step_index in range(6):
        _, state = step(model, jnp.array(step_index % 2 == 0), state)
    assert len(traces) == 1


# ---------------------------------------------------------------- outputs


class PytreeOut(eqx.Module):
    index: eqx.nn.StateIndex

    def __init__(self):
        self.index = eqx.nn.StateIndex(jnp.array(0.0))

    def __call__(self, x, state):
        total = state.get(self.index) + 1.0
        out = (x * total, {"count": total.astype(jnp.int32), "mean": x.mean()})
        return out, state.set(self.index, total)


def test_pytree_output():
    model, state = make(PytreeOut(), initial_output=-999)
    out, state = model(jnp.array(False), X, state)
    assert jtu.tree_structure(out) == jtu.tree_structure((X, {"count": 0, "mean": 0}))
    assert out[1]["count"].dtype == jnp.int32
    assert all(jnp.all(leaf == -999) for leaf in jtu.tree_leaves(out))
    out, state = model(jnp.array(True), X, state)
    out, state = model(jnp.array(False), X, state)
    np.testing.assert_allclose(out[0], X)
    assert out[1]["count"] == 1
    np.testing.assert_allclose(out[1]["mean"], 2.0)


def test_pytree_initial_output_per_leaf():
    init = (jnp.zeros(3), {"count": -1, "mean": jnp.array(7.0)})
    model, state = make(PytreeOut(), initial_output=init)
    out, _ = model(False, X, state)
    np.testing.assert_array_equal(out[0], jnp.zeros(3))
    assert out[1]["count"] == -1 and out[1]["mean"] == 7.0


def test_initial_output_minus_999():
    model, state = make(Accumulator(), initial_output=-999)
    events = [step in EVENT_STEPS for step in range(10)]
    outputs, _ = run_python_loop(model, state, [jnp.array(e) for e in events])
    np.testing.assert_array_equal(outputs[:3], jnp.full((3, 3), -999.0))
    np.testing.assert_allclose(outputs[3:7], jnp.broadcast_to(2 * X, (4, 3)))
    np.testing.assert_allclose(outputs[7:], jnp.broadcast_to(4 * X, (3, 3)))


class Stateless(eqx.Module):
    def __call__(self, x, state):
        return jnp.sin(x), state


def test_module_without_state():
    model, state = make(Stateless())
    out, state = model(jnp.array(False), X, state)
    assert jnp.all(jnp.isnan(out))
    out, state = model(jnp.array(True), X, state)
    out, state = model(jnp.array(False), 2 * X, state)
    np.testing.assert_allclose(out, jnp.sin(X))


# ---------------------------------------------------------------- bad input


class IntCounter(eqx.Module):
    index: eqx.nn.StateIndex

    def __init__(self):
        self.index = eqx.nn.StateIndex(jnp.array(0, dtype=jnp.int32))

    def __call__(self, x, state):
        count = state.get(self.index) + 1
        return count, state.set(self.index, count)


def test_integer_output_needs_initial_output():
    with pytest.raises(ValueError, match=r"`initial_output`.*int32.*nan"):
        make(IntCounter())
    with pytest.raises(ValueError, match=r"`initial_output`.*int32"):
        make(IntCounter(), initial_output=0.5)
    model, state = make(IntCounter(), initial_output=-1)
    out, _ = model(False, X, state)
    assert out.dtype == jnp.int32 and out == -1


def test_initial_output_wrong_shape_or_structure():
    with pytest.raises(ValueError, match=r"`initial_output` has shape \(5,\)"):
        make(Accumulator(), initial_output=jnp.zeros(5))
    with pytest.raises(ValueError, match=r"`initial_output` must be a single value"):
        make(PytreeOut(), initial_output=(0.0, 1.0))


@pytest.mark.parametrize(
    "event, error, match",
    [
        (1, TypeError, r"`event` must be a Python bool.*type int"),
        (1.0, TypeError, r"`event` must be a Python bool.*type float"),
        (jnp.array(1), TypeError, r"`event` must be a Python bool.*dtype int32"),
        (jnp.array([True, False]), ValueError, r"`event` must be a scalar.*\(2,\)"),
    ],
    ids=["python-int", "python-float", "int-array", "vector"],
)
def test_bad_event(event, error, match):
    model, state = make(Accumulator())
    with pytest.raises(error, match=match):
        model(event, X, state)
    with pytest.raises(error, match=match):
        eqx.filter_jit(lambda e, s: model(e, X, s))(event, state)


def test_example_input_rejected_by_module():
    linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))

    class WithLinear(eqx.Module):
        linear: eqx.nn.Linear
        index: eqx.nn.StateIndex

        def __call__(self, x, state):
            return self.linear(x), state

    module = WithLinear(linear, eqx.nn.StateIndex(jnp.zeros(())))
    with pytest.raises(
        TypeError,
        match=r"^UpdateOnEvent: calling the wrapped module on example_input to infer "
        r"its output shape failed: .*dot_general",
    ):
        make(module, x=jnp.zeros(4))


def test_call_with_differently_shaped_input():
    model, state = make(Stateless(), x=jnp.zeros(1))
    with pytest.raises(ValueError, match=r"returned \[float32\[3\]\].*float32\[1\]"):
        model(jnp.array(True), X, state)


def test_module_from_make_with_state_is_rejected():
    module, _ = eqx.nn.make_with_state(Accumulator)()
    with pytest.raises(ValueError, match=r"not the result of `eqx.nn.make_with_state`"):
        ep.UpdateOnEvent(module, X)


@pytest.mark.parametrize(
    "dtype, value, ok",
    [
        (jnp.int32, 2**40, False),
        (jnp.int32, -(2**40), False),
        (jnp.int32, 1.5, False),
        (jnp.int32, -1, True),
        (jnp.float32, 1e40, False),
        (jnp.float32, -1e40, False),
        (jnp.float32, 0.1, True),
        (jnp.float32, float("nan"), True),
        (jnp.bool_, 2, False),
    ],
)
def test_initial_output_must_be_representable_in_the_output_dtype(dtype, value, ok):
    class Counter(eqx.Module):
        index: eqx.nn.StateIndex

        def __init__(self):
            self.index = eqx.nn.StateIndex(jnp.zeros((), dtype))

        def __call__(self, x, state):
            total = state.get(self.index) + x
            return total, state.set(self.index, total)

    build = eqx.nn.make_with_state(ep.UpdateOnEvent)
    if ok:
        model, state = build(Counter(), jnp.ones((), dtype), initial_output=value)
        out, _ = model(False, jnp.ones((), dtype), state)
        np.testing.assert_array_equal(out, np.asarray(value).astype(dtype))
    else:
        with pytest.raises(
            ValueError, match="`initial_output` = .* cannot be represented"
        ):
            build(Counter(), jnp.ones((), dtype), initial_output=value)


def test_nested_update_on_event_says_what_to_pass():
    class Counter(eqx.Module):
        index: eqx.nn.StateIndex

        def __init__(self):
            self.index = eqx.nn.StateIndex(jnp.zeros(()))

        def __call__(self, x, state):
            total = state.get(self.index) + x
            return total, state.set(self.index, total)

    inner = ep.UpdateOnEvent(Counter(), jnp.ones(()))
    x = jnp.ones(())
    model, state = eqx.nn.make_with_state(ep.UpdateOnEvent)(inner, (True, x))
    out, state = model(True, (True, x), state)
    assert out == 1.0
    out, state = model(True, (False, x), state)  # the inner one is frozen
    assert out == 1.0
    with pytest.raises(TypeError, match=r"pair `x = \(inner_event, inner_x\)`"):
        model(True, x, state)
