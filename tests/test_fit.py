"""`ep.fit` against hand-written optax loops."""

import concurrent.futures
import functools
import os
import pathlib
import re
import warnings
from collections.abc import Callable
from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _compiles import Compilations
from _hlo import trip_counts_around
from _processes import on_8_devices, run_python

import eqxprob as ep


DATA = jnp.array([0.3, -1.2, 2.0, 0.7, 1.1, -0.4])


class Model(eqx.Module):
    loc: jax.Array
    scale: ep.Bijector
    bound: ep.Bijector
    fixed: ep.Frozen


def _model():
    return Model(
        loc=jnp.array(0.0),
        scale=ep.positive(1.0),
        bound=ep.bounded(0.5, 0.0, 2.0),
        fixed=ep.frozen(jnp.array(3.0)),
    )


def _loss(model, batch=DATA):
    m = ep.resolve(model)
    z = (batch - m.loc) / m.scale
    return jnp.mean(0.5 * z**2 + jnp.log(m.scale)) + (m.bound - 1.0) ** 2 + 0 * m.fixed


def _hand_written(model, optimiser, steps):
    """A plain jitted optax loop over the unconstrained parameters."""
    params = {"loc": model.loc, "u": model.scale.param, "b": model.bound.param}

    def loss(p):
        scale = jax.nn.softplus(p["u"])
        bound = 2.0 * jax.nn.sigmoid(p["b"])
        z = (DATA - p["loc"]) / scale
        return jnp.mean(0.5 * z**2 + jnp.log(scale)) + (bound - 1.0) ** 2

    state = optimiser.init(params)

    @jax.jit
    def step(params, state):
        value, grads = jax.value_and_grad(loss)(params)
        with jax.numpy_dtype_promotion("standard"):  # optax is not strict-clean
            updates, state = optimiser.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for _ in range(steps):
        params, state, value = step(params, state)
        losses.append(value)
    return params, jnp.stack(losses)


def test_fit_matches_a_hand_written_loop():
    optimiser = optax.adam(0.05)
    model, losses = ep.fit(
        _model(), _loss, optimiser=optimiser, steps=250, progress=False, chunk_size=64
    )
    params, expected = _hand_written(_model(), optimiser, 250)
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.loc, params["loc"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.scale.param, params["u"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bound.param, params["b"], rtol=1e-5, atol=1e-6)
    # The optimum of the Gaussian negative log-likelihood: mean and (biased) std.
    m = ep.resolve(model)
    np.testing.assert_allclose(m.loc, DATA.mean(), atol=2e-3)
    np.testing.assert_allclose(m.scale, DATA.std(), atol=2e-3)


def test_frozen_values_and_bounds_do_not_move_under_weight_decay():
    model = _model()
    trained, _ = ep.fit(
        model,
        _loss,
        optimiser=optax.adamw(0.05, weight_decay=0.5),
        steps=50,
        progress=False,
    )
    assert float(trained.fixed.value) == 3.0
    leaves_before = jax.tree_util.tree_leaves(eqx.filter(model.bound, lambda x: True))
    leaves_after = jax.tree_util.tree_leaves(eqx.filter(trained.bound, lambda x: True))
    moved = [not np.array_equal(a, b) for a, b in zip(leaves_before, leaves_after)]
    assert sum(moved) == 1  # only the unconstrained parameter, not low/high
    assert not np.array_equal(trained.bound.param, model.bound.param)


def test_repeated_fit_with_an_equal_model_does_not_recompile():
    """An equal model again compiles nothing; another `steps` at most one
    program (the chunk of the steps that remain after the chunks of the
    length the first call chose)."""
    optimiser = optax.adam(0.05)
    ep.fit(_model(), _loss, optimiser=optimiser, steps=20, progress=False)
    with Compilations() as c:
        ep.fit(_model(), _loss, optimiser=optimiser, steps=20, progress=False)
    assert c.count == 0
    with Compilations() as c:
        ep.fit(_model(), _loss, optimiser=optimiser, steps=30, progress=False)
    assert c.count <= 1


def test_minibatches_are_drawn_from_the_data_with_the_key():
    data = jnp.arange(12.0)
    seen = []

    def loss(model, batch):
        jax.debug.callback(lambda b: seen.append(np.asarray(b)), batch)
        return jnp.mean((batch - model) ** 2)

    def run():
        seen.clear()
        return ep.fit(
            jnp.array(0.0),
            loss,
            optimiser=optax.sgd(0.02),
            steps=300,
            data=data,
            batch_size=4,
            key=jax.random.PRNGKey(0),
            progress=False,
        )

    model, losses = run()
    first = [b.copy() for b in seen]
    assert losses.shape == (300,)
    assert all(b.shape == (4,) for b in seen)
    assert set(np.concatenate(seen).tolist()) == set(data.tolist())
    np.testing.assert_allclose(model, data.mean(), atol=0.5)
    # Rows are uniform with replacement: each row's share is 1/12 (300·4 draws).
    counts = np.bincount(np.concatenate(seen).astype(int), minlength=12)
    assert counts.min() > 60 and counts.max() < 150
    # Reproducible from the key, whatever the chunk lengths.
    again, _ = run()
    assert np.array_equal(np.concatenate(first), np.concatenate(seen))
    assert again == model
    # Full batch when `batch_size` is None: the exact mean.
    model, _ = ep.fit(
        jnp.array(0.0),
        lambda m, b: jnp.mean((b - m) ** 2),
        optimiser=optax.sgd(0.1),
        steps=200,
        data=data,
        progress=False,
    )
    np.testing.assert_allclose(model, data.mean(), rtol=1e-5)


def test_non_finite_loss_stops_with_the_step_and_last_finite_model():
    with pytest.raises(ep.NonFiniteLossError, match="not finite at step 1") as info:
        ep.fit(
            jnp.array(1.0), jnp.log, optimiser=optax.sgd(2.0), steps=10, progress=False
        )
    error = info.value
    assert error.step == 1
    assert float(error.model) == -1.0  # after the one finite step: 1 - 2 * (1/1)
    assert error.losses.shape == (2,) and np.isnan(error.losses[-1])


def test_a_non_finite_update_names_the_parameters_it_leaves_not_finite():
    model = {"a": jnp.array(1.0), "b": jnp.array(2.0)}
    loss = lambda m: m["a"] ** 2 + jnp.sqrt(jnp.maximum(m["b"], 0.0))  # noqa: E731
    with pytest.raises(ep.NonFiniteLossError, match="at step") as info:
        ep.fit(model, loss, optimiser=optax.sgd(4.0), steps=4, progress=False)
    message = str(info.value)
    assert "leaves `['b']` not finite" in message and "`['a']`" not in message


def test_non_finite_gradient_with_finite_loss_is_caught():
    loss = lambda x: jnp.sqrt(jnp.abs(x))  # finite at 0, gradient infinite there
    with pytest.raises(ep.NonFiniteLossError, match="at step 0"):
        ep.fit(jnp.array(0.0), loss, optimiser=optax.sgd(0.1), steps=5, progress=False)


def test_non_finite_loss_in_a_later_chunk_reports_the_global_step():
    # loss(x) = x while x > 0, nan after; sgd(0.1) from 1.05 gives x_k = 1.05 - 0.1 k,
    # first non-positive at k = 11: the last step of the third 4-step chunk.
    loss = lambda x: jnp.where(x > 0, x, jnp.nan)
    with pytest.raises(ep.NonFiniteLossError, match="not finite at step 11") as info:
        ep.fit(
            jnp.array(1.05),
            loss,
            optimiser=optax.sgd(0.1),
            steps=20,
            progress=False,
            chunk_size=4,
        )
    error = info.value
    expected = jnp.array(1.05)
    for _ in range(11):
        expected = expected - 0.1  # the same float32 steps as sgd
    assert error.step == 11
    assert float(error.model) == float(expected) < 0
    assert error.losses.shape == (12,) and np.isnan(error.losses[-1])
    np.testing.assert_allclose(error.losses[:-1], 1.05 - 0.1 * np.arange(11), rtol=1e-5)


def test_one_infinite_loss_mid_chunk_with_finite_parameters_is_caught():
    # sgd(0.05) on x**2 from 1 gives x_k = 0.9**k; the loss is +inf only while
    # 0.45 < x < 0.55 (k = 6), its gradient 2x finite throughout, so the
    # parameters after the chunk are finite and only that one loss shows it.
    def loss(x):
        return x**2 + jnp.where(jnp.abs(x - 0.5) < 0.05, jnp.inf, 0.0)

    with pytest.raises(ep.NonFiniteLossError, match="not finite at step 6") as info:
        ep.fit(
            jnp.array(1.0), loss, optimiser=optax.sgd(0.05), steps=20, progress=False
        )
    assert info.value.losses.shape == (7,) and np.isinf(info.value.losses[-1])
    np.testing.assert_allclose(info.value.losses[:-1], 0.81 ** np.arange(6), rtol=1e-5)


def test_non_finite_loss_with_minibatches_stops_at_the_same_step_in_any_chunks():
    # m climbs from 0 towards the data mean 5.5; the loss is nan once m > 3.
    def loss(m, batch):
        return jnp.where(m > 3.0, jnp.nan, jnp.mean((batch - m) ** 2))

    def error(chunk_size):
        with pytest.raises(ep.NonFiniteLossError) as info:
            ep.fit(
                jnp.array(0.0),
                loss,
                optimiser=optax.sgd(0.05),
                steps=200,
                data=jnp.arange(12.0),
                batch_size=4,
                key=jax.random.PRNGKey(1),
                progress=False,
                chunk_size=chunk_size,
            )
        return info.value

    # One step a chunk: the reference; other chunks must draw the same batches
    # and stop at the same step with the same model.
    reference = error(1)
    assert float(reference.model) > 3.0
    assert np.all(np.isfinite(reference.losses[:-1])) and np.isnan(reference.losses[-1])
    for chunk_size in (7, 200):
        e = error(chunk_size)
        assert e.step == reference.step and float(e.model) == float(reference.model)
        np.testing.assert_array_equal(e.losses, reference.losses)


def _nan_gradient_below(threshold):
    """x, with a nan gradient (and a finite value) once x < threshold."""
    return lambda x: jax.lax.cond(
        x < threshold, lambda x: x + jnp.sqrt(x - x), lambda x: x, x
    )


@pytest.mark.parametrize("chunk_size", [3, 4, 100])
def test_non_finite_gradient_at_the_very_last_step_is_caught(chunk_size):
    # x_k = 1 - 0.1 k; the gradient is nan from x_8 = 0.2 on, at step 8 of 9: every
    # loss is finite, only the final parameters are not.
    with pytest.raises(ep.NonFiniteLossError, match="at step 8") as info:
        ep.fit(
            jnp.array(1.0),
            _nan_gradient_below(0.25),
            optimiser=optax.sgd(0.1),
            steps=9,
            progress=False,
            chunk_size=chunk_size,
        )
    error = info.value
    np.testing.assert_allclose(float(error.model), 0.2, rtol=1e-5)
    assert error.losses.shape == (9,) and np.all(np.isfinite(error.losses))


def test_an_optimiser_that_repairs_nan_gradients_trains_on():
    optimiser = optax.chain(optax.zero_nans(), optax.sgd(0.1))
    model, losses = ep.fit(
        jnp.array(1.0),
        _nan_gradient_below(0.25),
        optimiser=optimiser,
        steps=12,
        progress=False,
        chunk_size=5,
    )
    # Steps 0-7 move x by 0.1 each; from x = 0.2 the zeroed gradient holds it.
    np.testing.assert_allclose(float(model), 0.2, rtol=1e-5)
    assert np.all(np.isfinite(losses))


BAD = {
    "zero steps": ({"steps": 0}, ValueError, "`steps` must be a positive integer"),
    "float steps": ({"steps": 5.0}, TypeError, "`steps` must be a positive integer"),
    "no key": (
        {"steps": 5, "data": DATA, "batch_size": 3},
        ValueError,
        "need a PRNG key",
    ),
    "big batch": (
        {"steps": 5, "data": DATA, "batch_size": 10, "key": jax.random.key(0)},
        ValueError,
        r"`batch_size` \(10\) is more than the number of rows",
    ),
    "ragged data": (
        {"steps": 5, "data": {"a": DATA, "b": DATA[:2]}},
        ValueError,
        "same number of rows",
    ),
    "progress": ({"steps": 5, "progress": "yes"}, TypeError, "`progress` must be"),
    "batch without data": (
        {"steps": 5, "batch_size": 2},
        ValueError,
        "`batch_size` needs `data`",
    ),
    "int key": (
        {"steps": 5, "data": DATA, "batch_size": 3, "key": 3},
        TypeError,
        r"`key` must be one PRNG key, e.g. `jax.random.key\(0\)`, got 3",
    ),
    "batch of keys": (
        {
            "steps": 5,
            "data": DATA,
            "batch_size": 3,
            "key": jax.random.split(jax.random.key(0), 3),
        },
        TypeError,
        "`key` must be one PRNG key",
    ),
    **{
        f"{kind} key": (
            {"steps": 5, "data": DATA, "batch_size": 3, "key": bad},
            TypeError,
            "`key` must be one PRNG key",
        )
        for kind, bad in [
            ("float", jnp.array([0.0, 1.0])),  # (a raw key's shape, not its dtype)
            ("NaN", jnp.array(jnp.nan)),
            ("empty", jnp.zeros((0,), jnp.uint32)),
            ("str", "0"),
        ]
    },
    "key without use": (
        {"steps": 5, "key": jax.random.key(0)},
        ValueError,
        "`key` is used only for minibatches",
    ),
    "uncalled optimiser": (
        {"steps": 5, "optimiser": optax.sgd},
        TypeError,
        r"call it .*optax.sgd\(1e-2\)",
    ),
}


@pytest.mark.parametrize("name", BAD, ids=list(BAD))
def test_bad_arguments(name):
    kwargs, error, match = BAD[name]
    kwargs = {"optimiser": optax.sgd(0.1), "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        ep.fit(jnp.array(0.0), lambda m, *b: m**2, **kwargs)


LOSSES = {
    "vector": (lambda m: m * jnp.ones(3), "real floating-point scalar, got shape"),
    "integer": (lambda m: jnp.int32(1), "dtype int32"),
    "complex": (lambda m: m.astype(jnp.complex64), "dtype complex"),
    "tuple": (lambda m: (m**2, m), "must return a scalar array, got tuple"),
    "arity": (lambda: 1.0, r"cannot be called as `loss_fn\(model\)`"),
}


@pytest.mark.parametrize("name", LOSSES, ids=list(LOSSES))
def test_bad_losses_name_loss_fn_and_say_what_it_must_return(name):
    loss, match = LOSSES[name]
    with pytest.raises(TypeError, match=match):
        ep.fit(jnp.array(1.0), loss, optimiser=optax.sgd(0.1), steps=3, progress=False)


def test_wrong_loss_arity_with_data_says_model_batch():
    with pytest.raises(TypeError, match=r"loss_fn\(model, batch\)"):
        ep.fit(
            jnp.array(1.0),
            lambda m: m**2,
            optimiser=optax.sgd(0.1),
            steps=3,
            data=DATA,
            progress=False,
        )


def test_nothing_to_train_is_an_error():
    for model in (
        {},
        {"n": 3, "x": 1.5},  # a Python float in a plain dict is static
        ep.frozen(ep.FixedDistrax(distrax.Normal, 0.0, 1.0)),
        ep.frozen(jnp.array(1.0)),
    ):
        with pytest.raises(ValueError, match="nothing to train"):
            ep.fit(
                model,
                lambda m: jnp.asarray(1.0),
                optimiser=optax.sgd(0.1),
                steps=50,
                progress=False,
            )


def test_numpy_integer_steps():
    model, losses = ep.fit(
        jnp.array(1.0),
        lambda m: m**2,
        optimiser=optax.sgd(0.1),
        steps=np.int64(7),  # pyright: ignore[reportArgumentType]  (typed `int`; any integer runs)
        progress=False,
    )
    assert losses.shape == (7,)
    np.testing.assert_allclose(model, 0.8**7, rtol=1e-6)


def test_calls_differing_in_steps_or_with_equal_fresh_optimisers_do_not_compile():
    def run(steps):
        # A fresh lambda and a fresh optimiser at every call, as in a notebook.
        return ep.fit(
            _model(),
            lambda m: _loss(m),
            optimiser=optax.adam(0.05),
            steps=steps,
            progress=False,
        )

    run(20)
    for steps in (20, 37, 250, 1):
        with Compilations() as c:
            run(steps)
        assert c.count <= 1  # (at most the chunk of the steps left)
    with Compilations() as c:
        for steps in (20, 37, 250, 1):
            run(steps)
    assert c.count == 0
    # A different optimiser (another learning rate) does compile: the control.
    with Compilations() as c:
        ep.fit(_model(), _loss, optimiser=optax.adam(0.01), steps=5, progress=False)
    assert c.count > 0


def _scan_fit(x0, loss, optimiser, steps):
    """A hand-written `lax.scan` of optax steps: the trained array and losses."""

    def body(carry, _):
        x, state = carry
        value, grads = jax.value_and_grad(loss)(x)
        updates, state = optimiser.update(grads, state, x)
        return (optax.apply_updates(x, updates), state), value

    (x, _), losses = jax.lax.scan(body, (x0, optimiser.init(x0)), None, length=steps)
    return x, losses


@pytest.mark.standard_promotion("the hand-written reference runs optax directly")
def test_multisteps_trains_as_its_gradient_transformation_in_a_scan():
    """`optax.MultiSteps` (not itself a `GradientTransformation`) is accepted and
    trains as its transformation does in a hand-written `lax.scan`: updates every
    third step."""
    square = lambda x: jnp.sum((x - 3.0) ** 2)
    multi = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=3)
    x, losses = ep.fit(jnp.zeros(2), square, optimiser=multi, steps=30, progress=False)
    hand_x, hand = _scan_fit(jnp.zeros(2), square, multi.gradient_transformation(), 30)
    np.testing.assert_allclose(np.asarray(losses), np.asarray(hand), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(x), np.asarray(hand_x), rtol=1e-6)
    assert losses[0] == losses[1] == losses[2] != losses[3]


@pytest.mark.standard_promotion("the hand-written reference runs optax directly")
def test_an_equal_fresh_multisteps_compiles_nothing_and_a_changed_one_does():
    """A fresh but equal `optax.MultiSteps` traces to the same program and
    reuses it; another `every_k_schedule`, another inner optimiser or an
    attribute changed in place trains as its own transformation does in a
    hand-written scan."""
    square = lambda x: jnp.sum((x - 3.0) ** 2)

    def run(multi):
        return ep.fit(jnp.zeros(2), square, optimiser=multi, steps=12, progress=False)

    run(optax.MultiSteps(optax.sgd(0.1), every_k_schedule=3))
    with Compilations() as c:
        run(optax.MultiSteps(optax.sgd(0.1), every_k_schedule=3))
    assert c.count == 0
    changed = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=3)
    changed._use_grad_mean = False  # (in place: the sum of the 3 gradients)
    for multi in (
        optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2),
        optax.MultiSteps(optax.sgd(0.2), every_k_schedule=3),
        changed,
    ):
        x, losses = run(multi)
        hand_x, hand = _scan_fit(
            jnp.zeros(2), square, multi.gradient_transformation(), 12
        )
        np.testing.assert_allclose(np.asarray(losses), np.asarray(hand), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(x), np.asarray(hand_x), rtol=1e-6)


class _SkipAbove:
    """A user's `should_skip_update_fn` whose `__call__` reads `self.t` through a
    helper method."""

    def __init__(self, t):
        self.t = t

    def __call__(self, updates, gradient_step, params):
        return self._skip(updates), ()

    def _skip(self, updates):
        return optax.tree.norm(updates) > self.t


def test_a_user_object_held_by_a_library_object_changed_in_place_is_seen():
    # A fresh MultiSteps holding the same skip object, changed in place through an
    # attribute only a helper method reads: trained to the old threshold (found by
    # the red team; a fresh MultiSteps had compiled anew every call before).
    skip, square = _SkipAbove(1e9), lambda m: jnp.sum((m - 3.0) ** 2)

    def run():
        multi = optax.MultiSteps(optax.sgd(0.1), 1, should_skip_update_fn=skip)
        return ep.fit(jnp.zeros(()), square, optimiser=multi, steps=50, progress=False)

    assert jnp.allclose(run()[0], 3.0, atol=1e-3)
    skip.t = -1.0  # every update skipped
    assert run()[0] == 0.0


_HOLDER: Any = optax.MultiSteps(optax.sgd(0.1), 1)  # (given a user's attribute below)


def test_a_library_object_reached_by_two_functions_trains_what_both_read():
    # Two functions read different attributes of a user's object held by a
    # library object: changing the second's must change what is trained.
    class Config:
        offset, target = 0.0, 1.0

    _HOLDER.cfg = Config()  # (a library object's attribute, set by the user)

    def a_first(m):
        return _HOLDER.cfg.offset * m

    def b_then(m):
        return (m - _HOLDER.cfg.target) ** 2

    loss = lambda m: jnp.sum(a_first(m) + b_then(m))
    for target in (1.0, 5.0):
        _HOLDER.cfg.target = target
        x, _ = ep.fit(jnp.zeros(()), loss, optimiser=optax.sgd(0.1), steps=200,
                      progress=False)  # fmt: skip
        assert jnp.allclose(x, target, atol=1e-3)


@pytest.mark.standard_promotion("the hand-written reference runs optax directly")
@pytest.mark.parametrize(
    "inner", [pytest.param("lbfgs", marks=pytest.mark.slow), "reduce_on_plateau"]
)
def test_multisteps_passes_the_loss_on_to_an_optimiser_that_needs_it(inner):
    """`optax.MultiSteps` around an optimiser that takes `value=`, `grad=` and
    `value_fn=` trains as a hand-written loop passing them to its `update` (the
    red team: it failed with optax's missing-argument TypeError)."""
    loss = lambda x: jnp.sum((x - 3.0) ** 2) + jnp.sum(jnp.cosh(0.3 * x))
    inner_opt = {
        "lbfgs": optax.lbfgs(),
        "reduce_on_plateau": optax.chain(
            optax.adam(0.3), optax.contrib.reduce_on_plateau()
        ),
    }[inner]
    multi = optax.MultiSteps(inner_opt, every_k_schedule=2)
    x, state, hand = jnp.zeros(2), multi.init(jnp.zeros(2)), []
    for _ in range(6):
        value, grad = jax.value_and_grad(loss)(x)
        updates, state = multi.update(
            grad, state, x, value=value, grad=grad, value_fn=loss
        )
        x = optax.apply_updates(x, updates)
        hand.append(value)
    got, losses = ep.fit(jnp.zeros(2), loss, optimiser=multi, steps=6, progress=False)
    np.testing.assert_allclose(np.asarray(losses), np.asarray(hand), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x), rtol=1e-5)
    assert not np.allclose(np.asarray(got), 0.0)


def test_a_fit_stopping_just_before_a_nan_runs_under_jax_debug_nans():
    """Under `jax_debug_nans` a fit whose steps are all finite runs, though the
    next step would meet a NaN loss: no step is computed past `steps`."""
    loss = lambda x: jnp.where(x > 0, x, jnp.nan)  # finite until x < 0
    with jax.debug_nans(True):
        x, losses = ep.fit(
            jnp.array(1.05), loss, optimiser=optax.sgd(0.1), steps=11,
            progress=False, chunk_size=4,
        )  # fmt: skip
    np.testing.assert_allclose(float(x), 1.05 - 1.1, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(losses), 1.05 - 0.1 * np.arange(11), 1e-5)


@pytest.mark.parametrize(
    "model, path",
    [
        ({"a": jnp.array(0.5), "cap": jnp.array(jnp.inf)}, "['cap']"),
        ({"a": jnp.array([0.5, jnp.nan]), "b": jnp.array(1.0)}, "['a']"),
        ([jnp.array(-jnp.inf), jnp.array([1.0, jnp.inf])], "[0], [1]"),
    ],
)
def test_a_non_finite_trainable_parameter_at_the_start_is_named(model, path):
    """A model that starts with a non-finite trainable parameter is refused with
    its path, not as a loss that went non-finite (the red team: the loss and
    gradient were finite, and `error.model` was not)."""
    loss = lambda m: jnp.sum(
        jnp.concatenate([jnp.minimum(v, 10.0).ravel() for v in jax.tree.leaves(m)])
    )
    with pytest.raises(ValueError, match=re.escape(f"parameter(s) {path} of the")):
        ep.fit(model, loss, optimiser=optax.adam(0.1), steps=5, progress=False)


def test_a_step_count_past_int32_is_refused_before_any_step():
    """`state.step + steps` beyond 2**31 - 1 (the int32 step numbers that draw
    batches and keys) is an error up front, not an overflow after the steps
    (eagerly) or a wrapped step count (under `jax.jit`)."""
    square = lambda x: jnp.sum((x - 3.0) ** 2)
    opt = optax.adam(0.1)
    state = ep.FitState.init(jnp.zeros(2), opt)
    state = eqx.tree_at(lambda s: s.step, state, jnp.int32(2**31 - 5))
    fit = functools.partial(ep.fit, optimiser=opt, progress=False, state=state)
    x, _ = fit(jnp.zeros(2), square, steps=4)  # (2**31 - 1: the last)
    assert np.all(np.isfinite(np.asarray(x)))
    with pytest.raises(ValueError, match=r"plus `steps` \(5\) at most 2\*\*31 - 1"):
        fit(jnp.zeros(2), square, steps=5)


def test_a_finite_fit_runs_under_jax_debug_nans():
    """The chunk's buffers start as zeros, not NaN: under `jax_debug_nans` a fit
    whose losses are finite runs and reaches the optimum."""
    square = lambda x: jnp.sum((x - 3.0) ** 2)
    with jax.debug_nans(True):
        x, losses = ep.fit(
            jnp.zeros(2), square, optimiser=optax.adam(0.1), steps=300,
            progress=False,
        )  # fmt: skip
    np.testing.assert_allclose(x, 3.0, atol=1e-3)
    assert losses.shape == (300,) and np.isfinite(losses).all()


def test_minibatch_step_cost_does_not_grow_with_the_rows():
    """The compiled step is the same program for 10k and 1M rows (no sort, no
    permutation): a deterministic proxy for a flat per-step cost. (`ep.fit` under
    `jax.jit` compiles its chunk into the caller's program.)"""
    from _hlo import count_hlo_ops

    def train(data, key):
        return ep.fit(
            jnp.zeros(3),
            lambda m, b: jnp.mean((b - m) ** 2),
            optimiser=optax.sgd(0.1),
            steps=5,
            data=data,
            batch_size=64,
            key=key,
            progress=False,
        )

    def hlo(rows) -> str:
        lowered = jax.jit(train).lower(jnp.zeros((rows, 3)), jax.random.key(0))
        text = lowered.compile().as_text()
        assert text is not None
        return text

    small, large = hlo(10_000), hlo(1_000_000)
    assert "sort" not in small and "sort" not in large
    assert count_hlo_ops(small) == count_hlo_ops(large)


def test_fit_under_jit_and_vmap_is_the_eager_fit():
    """Traced, `fit` becomes part of the caller's program, chunks and all."""

    def loss(x, batch, key):
        return jnp.mean((batch - x) ** 2) + 0.01 * jax.random.normal(key)

    kw: dict[str, Any] = dict(
        optimiser=optax.adam(0.1), steps=25, data=DATA, batch_size=4, progress=False,
        chunk_size=10,
    )  # fmt: skip
    key = jax.random.key(0)
    model, losses, state = ep.fit(
        jnp.array(0.0), loss, key=key, return_state=True, **kw
    )
    jitted = jax.jit(lambda m, k: ep.fit(m, loss, key=k, return_state=True, **kw))
    m, traced_losses, s = jitted(jnp.array(0.0), key)
    np.testing.assert_allclose(m, model, rtol=1e-6)
    np.testing.assert_allclose(traced_losses, losses, rtol=1e-6)
    assert s.step == state.step == 25
    np.testing.assert_allclose(s.opt_state[0].mu, state.opt_state[0].mu, rtol=1e-6)
    # a batch of fits, one per starting point
    starts = jnp.array([0.0, 1.0, -2.0])
    batched, batched_losses = jax.vmap(lambda m: ep.fit(m, loss, key=key, **kw))(starts)
    assert batched_losses.shape == (3, 25)
    for start, b in zip(starts, batched):
        np.testing.assert_allclose(b, ep.fit(start, loss, key=key, **kw)[0], rtol=1e-5)


def test_vmap_over_a_value_only_the_loss_reads():
    """The model's arrays concrete, the loss closing over a batched tracer: the
    fit is traced into the vmapped program (it raised a tracer conversion error),
    and each fit reaches its own closed-form optimum with the eager fit's losses."""
    kw: dict[str, Any] = dict(optimiser=optax.adam(0.1), steps=300, progress=False)

    def fit_to(t):
        return ep.fit(jnp.zeros(2), lambda x: jnp.sum((x - t) ** 2), **kw)

    targets = jnp.array([1.0, 2.0, -3.0])
    trained, losses = jax.vmap(fit_to)(targets)
    np.testing.assert_allclose(trained, jnp.repeat(targets[:, None], 2, 1), atol=1e-3)
    for t, row in zip(targets, losses):
        np.testing.assert_allclose(row, fit_to(t)[1], rtol=1e-5)


def test_stochastic_loss_gets_a_fresh_key_per_step_reproducibly():
    seen = []

    def loss(m, key):
        noise = jax.random.normal(key)
        jax.debug.callback(lambda k: seen.append(float(k)), noise)
        return (m - noise) ** 2

    kwargs: dict[str, Any] = dict(optimiser=optax.sgd(0.01), steps=40, progress=False)
    a, la = ep.fit(jnp.array(0.0), loss, key=jax.random.key(1), **kwargs)
    first = list(seen)
    seen.clear()
    b, lb = ep.fit(jnp.array(0.0), loss, key=jax.random.key(1), chunk_size=7, **kwargs)
    assert first == seen and a == b
    assert len(set(first)) == 40  # a different key every step
    # The keys are `fold_in(k, step)` of the loss's half of `split(key)`.
    k = jax.random.split(jax.random.key(1))[1]
    expected = [float(jax.random.normal(jax.random.fold_in(k, i))) for i in range(3)]
    np.testing.assert_allclose(first[:3], expected, rtol=1e-6)


def test_resuming_equals_one_long_run():
    def loss(m, batch, key):
        return jnp.mean((batch - m) ** 2) + 0.01 * jax.random.normal(key)

    common: dict[str, Any] = dict(
        optimiser=optax.adam(0.1), data=DATA, batch_size=3, key=jax.random.key(0),
        progress=False,
    )  # fmt: skip
    m1, l1, state = ep.fit(jnp.array(0.0), loss, steps=25, return_state=True, **common)
    m2, l2 = ep.fit(m1, loss, steps=35, state=state, **common)
    whole, lw = ep.fit(jnp.array(0.0), loss, steps=60, **common)
    np.testing.assert_allclose(m2, whole, rtol=1e-6)
    np.testing.assert_allclose(jnp.concatenate([l1, l2]), lw, rtol=1e-6)


def test_an_optimiser_whose_state_starts_from_the_parameters():
    """An initial state that is not zeros (here a copy of the parameters) is made
    inside the first chunk, and carried over when resuming; a plain
    `GradientTransformation` (no extra-args support) works too."""

    def anchored(lr):  # sgd pulled back towards the starting point
        def init(params):
            return params

        def update(updates, state, params=None):  # (the state: the anchor)
            step = jax.tree_util.tree_map(
                lambda g, p, a: -lr * (g + (p - a)), updates, params, state
            )
            return step, state

        return optax.GradientTransformation(init, update)

    loss = lambda x: jnp.sum((x - 3.0) ** 2)  # noqa: E731
    x = jnp.array([1.0, -1.0])
    expected = x
    for _ in range(40):
        expected = expected - 0.1 * (2 * (expected - 3.0) + (expected - x))
    kw: dict[str, Any] = dict(optimiser=anchored(0.1), progress=False, chunk_size=16)
    trained, _ = ep.fit(x, loss, steps=40, **kw)
    np.testing.assert_allclose(trained, expected, rtol=1e-5)
    half, _, state = ep.fit(x, loss, steps=25, return_state=True, **kw)
    np.testing.assert_allclose(state.opt_state, x)  # the anchor, not zeros
    resumed, _ = ep.fit(half, loss, steps=15, state=state, **kw)
    np.testing.assert_allclose(resumed, expected, rtol=1e-5)


def test_lbfgs_reaches_the_optimum_of_a_quadratic_like_scipy():
    scipy_optimize = pytest.importorskip("scipy.optimize")
    a = jnp.array([[3.0, 0.5], [0.5, 1.0]])
    b = jnp.array([1.0, -2.0])

    def loss(x):
        return 0.5 * x @ a @ x - b @ x + jnp.sum(jnp.cosh(0.3 * x))

    x, losses = ep.fit(
        jnp.zeros(2), loss, optimiser=optax.lbfgs(), steps=30, progress=False
    )
    ref = scipy_optimize.minimize(
        lambda v: float(loss(jnp.asarray(v, jnp.float32))),
        np.zeros(2),
        jac=lambda v: np.asarray(jax.grad(loss)(jnp.asarray(v, jnp.float32))),
        method="BFGS",
    )
    np.testing.assert_allclose(x, ref.x, atol=1e-4)
    # reduce_on_plateau needs the value too
    ep.fit(
        jnp.zeros(2),
        loss,
        optimiser=optax.chain(optax.adam(0.1), optax.contrib.reduce_on_plateau()),
        steps=10,
        progress=False,
    )


@pytest.mark.parametrize("how", ["signal", "raise"])
def test_keyboard_interrupt_returns_the_work_done(how):
    """Ctrl-C at the 40th step (a SIGINT, or a KeyboardInterrupt raised in a
    host callback, which XLA wraps), from a callback: no timer races the fit.
    `fit` warns and returns the model of the chunks finished before it."""
    import signal

    calls = [0]

    def interrupt():
        calls[0] += 1
        if calls[0] == 40:
            if how == "signal":
                signal.raise_signal(signal.SIGINT)
            else:
                raise KeyboardInterrupt

    def loss(m):
        jax.debug.callback(interrupt)
        return (m - 1.0) ** 2

    # (Python's own Ctrl-C handler, as in a terminal: a runner started in the
    # background, as CI may be, inherits SIGINT ignored.)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.warns(UserWarning, match="interrupted after"):
            model, losses, state = ep.fit(
                jnp.array(0.0), loss, optimiser=optax.sgd(0.01), steps=1000,
                progress=False, chunk_size=8, return_state=True,
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, handler)
    assert 0 < len(losses) < 40 and int(state.step) == len(losses)
    # the returned model is exactly `len(losses)` steps of gradient descent
    np.testing.assert_allclose(model, 1 - 0.98 ** len(losses), rtol=1e-4)


def test_progress_bar_goes_to_stderr_with_the_loss(capsys):
    ep.fit(jnp.array(1.0), lambda m: m**2, optimiser=optax.sgd(0.1), steps=20)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "20/20" in captured.err and "loss=" in captured.err


def test_fresh_optimisers_with_schedules_do_not_recompile():
    def run():
        schedule = optax.warmup_cosine_decay_schedule(0.0, 0.05, 10, 100)
        return ep.fit(
            _model(), _loss, optimiser=optax.adam(schedule), steps=20, progress=False
        )

    run()
    with Compilations() as c:
        run()
    assert c.count == 0


def test_data_on_a_device_compiles_the_chunk_once():
    def compiles(data):
        with Compilations() as c:
            ep.fit(
                jnp.array(0.0),
                lambda m, b, _d=data: jnp.mean((b - m) ** 2),  # a new loss each call
                optimiser=optax.sgd(0.1),
                steps=40,  # several chunks: the first call's outputs feed the next
                data=data,
                progress=False,
            )
        return c.count

    plain = compiles(jnp.arange(6.0))
    committed = compiles(jax.device_put(jnp.arange(6.0) + 1, jax.devices()[0]))
    assert committed == plain


def test_a_new_program_is_lowered_once_and_compiled_once():
    """A fit whose chunks are new (another constant in the loss) lowers each
    to StableHLO once, for the cache's key and the compile both, and compiles
    nothing eagerly (its keys are split inside the chunk); again, it lowers
    them for their keys only."""
    data = jnp.linspace(0.0, 1.0, 50)

    def counts(c: float) -> tuple[int, int]:
        def loss(m, b, key):
            noise = 1e-3 * jax.random.normal(key, b.shape)
            return jnp.mean((b + noise - m * c) ** 2)

        with Compilations() as n:
            ep.fit(
                jnp.array(0.5),
                loss,
                optimiser=optax.adam(0.1),
                steps=5,
                data=data,
                batch_size=8,
                key=jax.random.key(0),
                progress=False,
            )
        return n.lowerings, n.count

    counts(1.0)  # (eager operations of this shape, compiled once per process)
    lowered, compiled = counts(2.0)
    assert lowered == compiled >= 1
    assert counts(2.0) == (lowered, 0)  # the same programs: lowered for keys only


def test_progress_bar_shows_in_a_jupyter_kernel():
    """A real kernel (nbclient + ipykernel): `tqdm.auto` decides how to draw the
    bar (a widget with ipywidgets, text otherwise), and the loss shows."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    notebook = nbformat.v4.new_notebook()
    code = (
        "import jax.numpy as jnp, optax, eqxprob as ep\n"
        "m, losses = ep.fit(jnp.array(1.0), lambda m: m**2, "
        "optimiser=optax.sgd(0.1), steps=20)\n"
        "print(len(losses))"
    )
    notebook.cells.append(nbformat.v4.new_code_cell(code))
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    widgets = [o for o in outputs if o["output_type"] == "display_data"]
    assert "20\n" in text  # the cell ran to the end
    assert widgets or ("20/20" in text and "loss=" in text)
    assert "Warning" not in text  # without ipywidgets: tqdm's IProgress warning


@pytest.mark.slow
@pytest.mark.standard_promotion("the gpx.fit reference runs optax: _tree_math.py:449")
def test_a_gpjax_model_fits_unchanged_like_gpx_fit():
    """GPJax 1.0 models (paramax-wrapped parameters) train with `ep.fit` as they
    are, to `gpx.fit`'s result; a `paramax.non_trainable` value stays put under
    adamw's weight decay (under `gpx.fit` it decays: GPJax partitions with
    `eqx.is_inexact_array`)."""
    gpx = pytest.importorskip("gpjax")
    paramax = pytest.importorskip("paramax")
    from gpjax.parameters import val

    with jax.enable_x64(True):
        x = jnp.linspace(0.0, 10.0, 40)
        y = jnp.sin(x) + 0.1 * jax.random.normal(jax.random.key(0), (40,))
        data = gpx.Dataset(X=x[:, None], y=y[:, None])
        prior = gpx.gps.Prior(
            mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF()
        )
        posterior = prior * gpx.likelihoods.Gaussian()
        nmll = lambda m, d: -gpx.objectives.conjugate_mll(m, d)  # noqa: E731
        opt = optax.adam(0.01)
        theirs, _ = gpx.fit(
            model=posterior, objective=nmll, train_data=data, optim=opt,
            num_iters=200, verbose=False,
        )  # fmt: skip
        ours, _ = ep.fit(
            posterior, lambda m: nmll(m, data), optimiser=opt, steps=200,
            progress=False,
        )  # fmt: skip
        for get in (
            lambda m: m.prior.kernel.lengthscale,
            lambda m: m.prior.kernel.variance,
            lambda m: m.likelihood.obs_stddev,
        ):
            np.testing.assert_allclose(val(get(ours)), val(get(theirs)), rtol=1e-9)
        frozen = eqx.tree_at(
            lambda m: m.prior.kernel.variance,
            posterior,
            paramax.non_trainable(jnp.array(0.7)),
        )
        decay = optax.adamw(0.05, weight_decay=0.5)
        ours, _ = ep.fit(
            frozen, lambda m: nmll(m, data), optimiser=decay, steps=50,
            progress=False,
        )  # fmt: skip
        assert float(paramax.unwrap(ours.prior.kernel.variance)) == 0.7


def test_a_loss_that_ignores_the_trainable_parameters_is_an_error():
    # Python floats given to FixedDistrax are trainable leaves, but this loss
    # never reads them: 50 identical losses would be no training at all.
    model = ep.FixedDistrax(distrax.Normal, 0.0, 1.0)
    with pytest.raises(ValueError, match="does not depend on any trainable"):
        ep.fit(
            model,
            lambda d: jnp.asarray(1.0),
            optimiser=optax.sgd(0.1),
            steps=50,
            progress=False,
        )
    # the same model with a loss that reads it trains
    trained, losses = ep.fit(
        model,
        lambda d: (d.mean() - 2.0) ** 2,
        optimiser=optax.sgd(0.1),
        steps=50,
        progress=False,
    )
    assert losses[-1] < losses[0] and abs(float(trained.loc) - 2.0) < 1e-3


def test_changes_to_what_the_loss_reads_are_trained():
    """A fresh compile whenever what the loss reads has changed: globals read in
    a comprehension, attributes of objects, bound methods and callable objects."""
    kw: dict[str, Any] = dict(optimiser=optax.adam(0.1), steps=300, progress=False)

    class Config:
        target: float

    config = Config()
    config.target = 1.0
    loss = lambda x: sum([(x[i] - config.target) ** 2 for i in range(2)], jnp.zeros(()))
    np.testing.assert_allclose(ep.fit(jnp.zeros(2), loss, **kw)[0], 1.0, atol=1e-3)
    config.target = 3.0
    np.testing.assert_allclose(ep.fit(jnp.zeros(2), loss, **kw)[0], 3.0, atol=1e-3)

    class Target:
        def __init__(self):
            self.t = 1.0

        def __call__(self, x):
            return jnp.sum((x - self.t) ** 2)

    target = Target()
    np.testing.assert_allclose(ep.fit(jnp.zeros(2), target, **kw)[0], 1.0, atol=1e-3)
    target.t = 4.0
    np.testing.assert_allclose(ep.fit(jnp.zeros(2), target, **kw)[0], 4.0, atol=1e-3)
    np.testing.assert_allclose(
        ep.fit(jnp.zeros(2), target.__call__, **kw)[0], 4.0, atol=1e-3
    )


def test_numpy_minibatch_data_and_mismatched_states():
    data = np.linspace(0.0, 2.0, 8)

    def run(rows):
        return ep.fit(
            jnp.array(0.0),
            lambda m, b: jnp.mean((b - m) ** 2),
            optimiser=optax.adam(0.1),
            steps=50,
            data=rows,
            batch_size=4,
            key=jax.random.key(0),
            progress=False,
        )

    (a, la), (b, lb) = run(data), run(jnp.asarray(data))  # NumPy rows as JAX's
    assert a == b and np.array_equal(la, lb)
    loss = lambda x: jnp.sum((x - 1.0) ** 2)  # noqa: E731
    _, _, state = ep.fit(
        jnp.zeros(2), loss, optimiser=optax.adam(0.1), steps=5, progress=False,
        return_state=True,
    )  # fmt: skip
    for model, opt in ((jnp.zeros(3), optax.adam(0.1)), (jnp.zeros(2), optax.sgd(0.1))):
        with pytest.raises(ValueError, match="`state` does not match"):
            ep.fit(model, loss, optimiser=opt, steps=5, progress=False, state=state)


TARGET = jnp.array(1.0)


def _to_global_target(x):
    return jnp.sum((x - jnp.ravel(TARGET)[:2]) ** 2)


def _to_max(x):
    return jnp.sum((x - max(1.0, 0.0)) ** 2)  # `max`: a builtin, until shadowed


def _trained(loss, steps=300):
    x, _ = ep.fit(
        jnp.zeros(2), loss, optimiser=optax.adam(0.1), steps=steps, progress=False
    )
    return x


def test_every_rebinding_of_what_the_loss_reads_is_trained():
    """Each kind of rebinding of what the loss reads must train to the new
    optimum (the target, found by the quadratic's closed form), never the old
    program's."""
    global TARGET
    np.testing.assert_allclose(_trained(_to_global_target), 1.0, atol=1e-3)
    old = TARGET
    try:
        TARGET = jnp.array(3.0)  # a rebound global
        np.testing.assert_allclose(_trained(_to_global_target), 3.0, atol=1e-3)
    finally:
        TARGET = old

    np.testing.assert_allclose(_trained(_to_max), 1.0, atol=1e-3)
    globals()["max"] = lambda a, b: 2.0  # a global that was missing appears
    try:
        np.testing.assert_allclose(_trained(_to_max), 2.0, atol=1e-3)
    finally:
        del globals()["max"]
    np.testing.assert_allclose(_trained(_to_max), 1.0, atol=1e-3)

    def make():
        target = jnp.array(1.0)

        def loss(x):
            return jnp.sum((x - target) ** 2)

        def set_target(value):
            nonlocal target
            target = value

        return loss, set_target

    loss, set_target = make()
    np.testing.assert_allclose(_trained(loss), 1.0, atol=1e-3)
    set_target(jnp.array(-2.0))  # a rebound closure cell
    np.testing.assert_allclose(_trained(loss), -2.0, atol=1e-3)

    with_default = lambda x, t=1.0: jnp.sum((x - t) ** 2)  # noqa: E731
    np.testing.assert_allclose(_trained(with_default), 1.0, atol=1e-3)
    with_default.__defaults__ = (4.0,)
    np.testing.assert_allclose(_trained(with_default), 4.0, atol=1e-3)

    def keyword(x, *, t=1.0):
        return jnp.sum((x - t) ** 2)

    np.testing.assert_allclose(_trained(keyword), 1.0, atol=1e-3)
    assert keyword.__kwdefaults__ is not None
    keyword.__kwdefaults__["t"] = 5.0  # changed in place
    np.testing.assert_allclose(_trained(keyword), 5.0, atol=1e-3)

    def other(x, *, t=1.0):
        return jnp.sum((x + t) ** 2)

    keyword.__code__ = other.__code__
    np.testing.assert_allclose(_trained(keyword), -5.0, atol=1e-3)


SIGN = 0.0


class ToGlobalTarget(eqx.Module):
    """A callable module whose `__call__` reads a global."""

    def __call__(self, x):
        return jnp.sum((x - TARGET) ** 2)


class ToTarget(eqx.Module):
    """A callable module with an array field and a function field."""

    target: jax.Array
    scale: Callable = lambda v: v

    def __call__(self, x):
        return jnp.sum((x - self.scale(self.target)) ** 2)


def test_an_equal_callable_module_made_afresh_compiles_nothing():
    """An `eqx.Module` made afresh per call with equal fields traces to the same
    program and reuses it; one whose array, large array or function field
    differs trains to its own optimum."""
    c = Compilations()
    for _ in range(2):
        with c:
            x = _trained(ToTarget(jnp.array([1.0, 2.0])))
        np.testing.assert_allclose(x, [1, 2], atol=1e-3)
    assert c.count == 0
    x = _trained(ToTarget(jnp.array([-1.0, 0.5])))
    np.testing.assert_allclose(x, [-1, 0.5], atol=1e-3)
    double = ToTarget(jnp.array([1.0, 2.0]), lambda v: 2 * v)
    np.testing.assert_allclose(_trained(double), [2, 4], atol=1e-3)
    big = lambda v: ToTarget(jnp.full((2000,), v))  # noqa: E731  (by identity)
    wide = lambda x, m: jnp.sum((x[:, None] - m.target[None, :2]) ** 2)  # noqa: E731
    for v in (1.5, -2.5):
        module = big(v)
        x = _trained(lambda x, m=module: wide(x, m))
        np.testing.assert_allclose(x, v, atol=1e-3)


class _Config:
    def __init__(self, t):
        self.t = t


class ReadsThrough(eqx.Module):
    """Reads a plain object's attribute, a property over a global and a class
    attribute."""

    w: jax.Array
    config: _Config
    SCALE = 1.0

    @property
    def shift(self):
        return self.w * SHIFT

    def __call__(self, x):
        return jnp.sum((x - self.w * self.config.t * self.SCALE - self.shift) ** 2)


SHIFT = 0.0


class Angle(eqx.Module):
    """A hashable callable Module (no array field) whose float sets the angle."""

    c: float

    def __call__(self, x):
        return jnp.sum((x - jnp.arctan2(self.c, -1.0)) ** 2)


class Nested(eqx.Module):
    inner: Angle

    def __call__(self, x):
        return self.inner(x)


class _Scaled(float):
    """A float with an attribute of its own."""

    s: float


def test_a_callable_module_trains_what_its_code_reads():
    """A Module in the loss reading a plain object's attribute, a property over
    a global, a class attribute, floats anywhere: each change trains to its own
    optimum (closed form), never to the program compiled before."""
    global SHIFT
    config = _Config(1.0)
    module = ReadsThrough(jnp.array(1.0), config)
    np.testing.assert_allclose(_trained(module), 1.0, atol=1e-3)
    config.t = 3.0  # changed in place
    np.testing.assert_allclose(_trained(module), 3.0, atol=1e-3)
    try:
        SHIFT = 1.0  # read by the property
        np.testing.assert_allclose(_trained(module), 4.0, atol=1e-3)
        ReadsThrough.SCALE = 2.0
        np.testing.assert_allclose(_trained(module), 7.0, atol=1e-3)
    finally:
        SHIFT, ReadsThrough.SCALE = 0.0, 1.0

    for make in (Angle, lambda c: Nested(Angle(c))):
        np.testing.assert_allclose(_trained(make(0.0)), np.pi, atol=1e-3)
        np.testing.assert_allclose(_trained(make(-0.0)), -np.pi, atol=1e-3)

        def ignoring(m):  # a loss that reads `m` but not its value
            return lambda x: (
                jnp.sum(x**2) + 0 * jax.lax.stop_gradient(jnp.nan_to_num(m(x)))
            )

        _trained(ignoring(make(float("nan"))), steps=5)
        with Compilations() as c:  # a fresh NaN field: the same program
            _trained(ignoring(make(float("nan"))), steps=5)
        assert c.count == 0

    scaled = _Scaled(0.5)
    scaled.s = 1.0
    by = lambda x: jnp.sum((x - scaled * scaled.s) ** 2)  # noqa: E731
    np.testing.assert_allclose(_trained(by), 0.5, atol=1e-3)
    scaled.s = 3.0
    np.testing.assert_allclose(_trained(by), 1.5, atol=1e-3)


@pytest.mark.standard_promotion("int8 times a strong int32 promotes: the point here")
def test_a_weak_and_a_strong_array_train_apart():
    """`int8 * weak 2` stays int8 (overflows to -56), `int8 * int32 2` is 200:
    equal bytes, different programs."""
    data = jnp.array([100], jnp.int8)

    def times(c):
        return lambda x: jnp.sum((x - (data * c).astype(jnp.float32)) ** 2)

    weak, strong = jnp.asarray(2), jnp.array(2, jnp.int32)
    assert weak.weak_type and not strong.weak_type
    for c, target in ((weak, -56.0), (strong, 200.0)):
        x, _ = ep.fit(
            jnp.zeros(()), times(c), optimiser=optax.adam(1.0), steps=1500,
            progress=False,
        )  # fmt: skip
        np.testing.assert_allclose(x, target, atol=1e-2)


def test_float_leaves_of_the_model_train_by_their_bits():
    """A Python float leaf of the model (not static) is part of the compiled
    program: 0.0 and -0.0 get their own, and a fresh NaN reuses one."""
    loss = lambda m: jnp.sum((m[0] - jnp.arctan2(m[1], -1.0)) ** 2)  # noqa: E731
    kw: dict[str, Any] = dict(optimiser=optax.adam(0.1), steps=300, progress=False)
    for c, angle in ((0.0, np.pi), (-0.0, -np.pi)):
        (x, _), _ = ep.fit((jnp.zeros(()), c), loss, **kw)
        np.testing.assert_allclose(x, angle, atol=1e-3)
    nan = lambda m: jnp.sum(m[0] ** 2) + 0 * jnp.nan_to_num(m[1])  # noqa: E731
    ep.fit((jnp.zeros(()), float("nan")), nan, **kw)
    with Compilations() as c:
        ep.fit((jnp.zeros(()), float("nan")), nan, **kw)
    assert c.count == 0


def test_signed_zeros_dtypes_and_a_callables_globals_train_apart():
    """Values that compare equal in Python but compute differently, and the
    globals read by a callable object's `__call__`: each trains to its own
    optimum (closed form), never to the one of a program compiled before."""
    global SIGN, TARGET
    at_angle = lambda x: jnp.sum((x - jnp.arctan2(SIGN, -1.0)) ** 2)  # noqa: E731
    np.testing.assert_allclose(_trained(at_angle), np.pi, atol=1e-3)
    try:
        SIGN = -0.0  # == 0.0, but arctan2(-0.0, -1) = -pi
        np.testing.assert_allclose(_trained(at_angle), -np.pi, atol=1e-3)
        fresh = lambda x: jnp.sum((x - jnp.arctan2(SIGN, -1.0)) ** 2)  # noqa: E731
        np.testing.assert_allclose(_trained(fresh), -np.pi, atol=1e-3)
    finally:
        SIGN = 0.0

    for value, dtype in ((-1, jnp.int4), (15, jnp.uint4)):  # the same byte
        c = jnp.array(value, dtype)
        loss = lambda x, c=c: jnp.sum((x - c.astype(jnp.float32)) ** 2)  # noqa: E731
        np.testing.assert_allclose(_trained(loss, steps=600), value, atol=1e-2)

    np.testing.assert_allclose(_trained(ToGlobalTarget()), 1.0, atol=1e-3)
    old = TARGET
    try:
        TARGET = jnp.array(-3.0)
        np.testing.assert_allclose(_trained(ToGlobalTarget()), -3.0, atol=1e-3)
    finally:
        TARGET = old


def test_complex_signed_zeros_a_nan_and_8_threads():
    """A complex trains with the signs of both parts; a NaN in the loss's
    closure still raises (no stale program), and a new NaN object compiles
    nothing (the same constant); 8 threads fitting their own targets at once
    each reach their own optimum."""

    def to_angle(c):
        return lambda x: jnp.sum((x - jnp.arctan2(c.imag, c.real)) ** 2)

    for c, angle in ((complex(-1.0, 0.0), np.pi), (complex(-1.0, -0.0), -np.pi)):
        np.testing.assert_allclose(_trained(to_angle(c)), angle, atol=1e-3)

    def to_target(t):
        return lambda x: jnp.sum((x - t) ** 2)

    for _ in range(2):
        with pytest.raises(ep.NonFiniteLossError):
            _trained(to_target(float("nan")), steps=5)

    def unless_nan(t):  # a NaN the loss reads but its value does not hold
        return lambda x: jnp.sum((x - jnp.where(jnp.isnan(t), 2.0, t)) ** 2)

    np.testing.assert_allclose(_trained(unless_nan(float("nan"))), 2.0, atol=1e-3)
    with Compilations() as c:  # a new NaN object: equal bits, the same program
        np.testing.assert_allclose(_trained(unless_nan(float("nan"))), 2.0, atol=1e-3)
    assert c.count == 0
    np.testing.assert_allclose(_trained(unless_nan(1.5)), 1.5, atol=1e-3)

    targets = [float(t) for t in range(-4, 4)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        trained = list(pool.map(lambda t: _trained(to_target(t)), targets))
    for t, x in zip(targets, trained):
        np.testing.assert_allclose(x, t, atol=1e-3)


def test_a_loss_closing_over_a_typed_prng_key():
    """A loss closing over a typed key: each key trains to its own draw (the
    quadratic's optimum), and an equal key compiles nothing."""

    def to_draw(k):
        return lambda x: jnp.sum((x - jax.random.normal(k, (2,))) ** 2)

    for seed in (0, 1):
        target = jax.random.normal(jax.random.key(seed), (2,))
        np.testing.assert_allclose(
            _trained(to_draw(jax.random.key(seed))), target, atol=1e-3
        )
    with Compilations() as c:
        _trained(to_draw(jax.random.key(1)))  # a new key object, equal
    assert c.count == 0


def test_a_rebound_global_array_trains_its_value_and_compiles_nothing():
    """A large array the loss closes over (over 1 MiB) is an input of the
    compiled program, not part of it: another object or another value compiles
    nothing and trains what the loss reads now. A small one is written into
    the program, by value: a new value compiles (the control)."""
    global TARGET
    old = TARGET
    try:
        TARGET = jnp.ones(500_000)
        _trained(_to_global_target)
        TARGET = jnp.ones(500_000)  # another object, the same value
        with Compilations() as c:
            _trained(_to_global_target)
        assert c.count == 0
        TARGET = 1.5 * jnp.ones(500_000)  # a new value: trained, not compiled
        with Compilations() as c:
            np.testing.assert_allclose(_trained(_to_global_target), 1.5, atol=1e-3)
        assert c.count == 0
        TARGET = jnp.full(2, 1.5)  # small: in the program
        _trained(_to_global_target)
        TARGET = jnp.full(2, -1.0)
        with Compilations() as c:
            np.testing.assert_allclose(_trained(_to_global_target), -1.0, atol=1e-3)
        assert c.count > 0
    finally:
        TARGET = old


def test_a_partial_whose_keywords_change_in_place_trains_them():
    """`partial.keywords` is a dict: changed in place, the partial is the same
    object but computes something else."""
    to = functools.partial(optax.l2_loss, targets=jnp.ones(2))
    read_as_global = lambda x: jnp.sum(to(x))  # noqa: E731
    np.testing.assert_allclose(_trained(read_as_global), 1.0, atol=1e-3)
    to.keywords["targets"] = 3 * jnp.ones(2)
    np.testing.assert_allclose(_trained(read_as_global), 3.0, atol=1e-3)

    loss = functools.partial(optax.l2_loss, targets=jnp.ones(()))  # the loss itself
    fit = functools.partial(
        ep.fit, optimiser=optax.adam(0.1), steps=300, progress=False
    )
    np.testing.assert_allclose(fit(jnp.zeros(()), loss)[0], 1.0, atol=1e-3)
    loss.keywords["targets"] = -2 * jnp.ones(())
    np.testing.assert_allclose(fit(jnp.zeros(()), loss)[0], -2.0, atol=1e-3)


def test_losses_of_uncommitted_arrays_are_uncommitted():
    """As the trained model: committing them to the default device would make
    `losses + x` fail for an `x` committed to another device."""
    model, losses = ep.fit(
        jnp.zeros(2),
        lambda x: jnp.sum(x**2),
        optimiser=optax.adam(0.1),
        steps=5,
        progress=False,
    )
    assert not model.committed and not losses.committed
    with pytest.raises(ep.NonFiniteLossError) as e:
        ep.fit(
            jnp.array(1.0), jnp.log, optimiser=optax.sgd(2.0), steps=10, progress=False
        )
    assert not e.value.losses.committed


def test_losses_are_where_the_steps_ran_on_8_devices():
    """The returned losses live on the trained model's devices (one device, or
    replicated over the data's mesh), equal the losses of the same fit on one
    device, and combine with the model without a transfer error."""
    code = """
import jax, jax.numpy as jnp, numpy as np, optax, eqxprob as ep
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
loss = lambda m, b: jnp.mean((b - m) ** 2)
kw = dict(optimiser=optax.adam(0.1), steps=130, progress=False)
data = jnp.arange(64.0)
m0, l0 = ep.fit(jnp.zeros(()), loss, data=data, **kw)
d3 = jax.devices()[3]
start, on3 = jax.device_put((jnp.zeros(()), data), d3)
m3, l3 = ep.fit(start, loss, data=on3, **kw)
assert l3.sharding == m3.sharding == jax.sharding.SingleDeviceSharding(d3), l3.sharding
mesh = Mesh(np.array(jax.devices()), ("x",))
rows = jax.device_put(data, NamedSharding(mesh, P("x")))
mm, lm = ep.fit(jnp.zeros(()), loss, data=rows, **kw)
assert lm.sharding.is_equivalent_to(mm.sharding, 1) and lm.sharding.is_fully_replicated
for losses in (l3, lm):
    np.testing.assert_allclose(np.asarray(losses), np.asarray(l0), rtol=1e-6)
    assert losses.shape == (130,) and losses.dtype == l0.dtype
(l3 + m3).block_until_ready(); (lm + mm).block_until_ready()
(l0 + jax.device_put(jnp.zeros(130), d3)).block_until_ready()  # uncommitted l0
weak = jax.device_put(jnp.asarray(0.0), d3)  # weakly typed, on device 3
assert weak.weak_type
mw, lw = ep.fit(weak, lambda m: (m - 1.0) ** 2, **kw)  # nothing else committed
assert mw.sharding == lw.sharding == jax.sharding.SingleDeviceSharding(d3)
print("ok")
"""
    assert on_8_devices(code).stdout.strip() == "ok"


@pytest.mark.slow
def test_fit_under_meshes_with_explicit_axes_on_8_devices():
    """Under `jax.make_mesh`'s default `Explicit` axes a sharding is part of an
    array's type: the losses' buffer, the optimiser state and each minibatch
    are typed to match. A sharded fit (whole data; batches that split evenly
    over the row shards and that do not; a parameter sharded over another axis;
    under `jax.jit`) gives the losses and model of the same fit on one device,
    keeps the parameter's sharding, continues from its `FitState` and names the
    failing step."""
    code = """
import jax, jax.numpy as jnp, numpy as np, optax, eqxprob as ep
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
loss = lambda m, b: jnp.mean((b - m["a"]) ** 2) + jnp.sum((m["w"] - 1.0) ** 2)
kw = dict(optimiser=optax.adam(0.1), steps=60, progress=False)
data = jnp.arange(128.0).reshape(64, 2)
start = {"a": jnp.zeros(()), "w": jnp.zeros(8)}
mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
mesh2 = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
cases = ((mesh, P("x"), P("x")), (mesh2, P(("x", "y")), P("y")),
         (mesh2, P("x", "y"), P()))
for batch in (None, 16, 12):
    extra = {} if batch is None else dict(batch_size=batch, key=jax.random.key(1))
    m0, l0 = ep.fit(start, loss, data=data, **kw, **extra)
    for mesh_, rows, w in cases:
        d = jax.device_put(data, NamedSharding(mesh_, rows))
        s = {"a": start["a"], "w": jax.device_put(start["w"], NamedSharding(mesh_, w))}
        m, losses = ep.fit(s, loss, data=d, **kw, **extra)
        np.testing.assert_allclose(np.asarray(losses), np.asarray(l0), rtol=1e-5)
        for k in m0:
            np.testing.assert_allclose(np.asarray(m[k]), np.asarray(m0[k]), rtol=1e-5)
        assert losses.sharding.is_fully_replicated and losses.sharding.mesh == mesh_
        assert m["w"].sharding.is_equivalent_to(NamedSharding(mesh_, w), 1)
        if mesh_ is mesh2:
            continue
        traced = jax.jit(lambda s, d: ep.fit(s, loss, data=d, **kw, **extra))(s, d)
        np.testing.assert_allclose(np.asarray(traced[1]), np.asarray(l0), rtol=1e-5)
        # The model closed over, on no mesh: only the data is typed with one.
        traced = jax.jit(lambda d: ep.fit(start, loss, data=d, **kw, **extra))(d)
        np.testing.assert_allclose(np.asarray(traced[1]), np.asarray(l0), rtol=1e-5)
w = jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("x")))
square = lambda w: jnp.sum((w - 1.0) ** 2)
kw = dict(optimiser=optax.adam(0.1), progress=False)
a, _, state = ep.fit(w, square, steps=20, return_state=True, **kw)
a, _ = ep.fit(a, square, steps=30, state=state, **kw)
b, _ = ep.fit(w, square, steps=50, **kw)
np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
# A state from a fit on one device, continued on the mesh (placed as the
# optimiser shards it), also with a state that starts from the parameters.
plateau = optax.chain(optax.adam(0.1), optax.contrib.reduce_on_plateau())
for optimiser in (optax.adam(0.1), plateau):
    kw = dict(optimiser=optimiser, progress=False)
    _, whole = ep.fit(jnp.zeros(8), square, steps=50, **kw)
    a, _, state = ep.fit(jnp.zeros(8), square, steps=20, return_state=True, **kw)
    a = jax.device_put(a, w.sharding)
    go_on = lambda a, state: ep.fit(a, square, steps=30, state=state, **kw)
    traced = jax.jit(go_on)(a, state)[1]
    a, rest = go_on(a, state)
    for losses in (rest, traced):
        np.testing.assert_allclose(np.asarray(losses), whole[20:], rtol=1e-5)
    assert a.sharding.spec == P("x")
kw = dict(optimiser=optax.adam(0.1), progress=False)
try:
    ep.fit(w, lambda w: jnp.sum(jnp.log(w + 0.05)), steps=10, **kw)
except ep.NonFiniteLossError as e:
    assert e.step == 1 and e.model.sharding.spec == P("x"), (e.step, e.model)
else:
    raise AssertionError("no NonFiniteLossError")
print("ok")
"""
    assert on_8_devices(code).stdout.strip() == "ok"


class _Term:
    """A callable whose `__call__` reads two global instances of its class."""

    def __call__(self, x):
        return _TERM_A(x) + _TERM_B(x) if x is None else jnp.sum((x - 1.0) ** 2)


_TERM_A, _TERM_B = _Term(), _Term()


def _walk(x):
    return _walk(x) + _walk_list(x) if x is None else jnp.sum((x - 1.0) ** 2)


def _walk_list(x):
    return _walk(x)


def test_vmap_of_closed_over_value_keeps_no_batched_values_alive():
    # A fit under a `jax.vmap` of a value its loss reads runs in the caller's
    # trace; nothing it caches may keep the batched values alive.
    import gc

    big = jnp.tile(jnp.arange(3.0)[:, None], (1, 40_000))  # targets 0, 1, 2
    fit = (
        lambda b: ep.fit(  # noqa: E731
            jnp.zeros(2),
            lambda x: jnp.sum((x - b[:2]) ** 2),
            optimiser=optax.adam(0.1),
            steps=300,
            progress=False,
        )
    )
    for i in range(3):
        x, losses = jax.vmap(fit)(big + i)
        assert jnp.allclose(x, big[:, :2] + i, atol=1e-3)
        assert losses.shape == (3, 300)
    gc.collect()
    assert not [a for a in jax.live_arrays() if a.shape == big.shape and a is not big]


class _Kernel(eqx.Module):
    lengthscale: jax.Array = ep.field(constraint=ep.constraints.positive)
    offset: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))
    fixed: jax.Array = ep.field(trainable=False)


def test_constrained_fields_holding_raw_arrays_ask_for_parameterize():
    """Forgetting `ep.parameterize`: the positive lengthscale would be trained
    as a plain number (to -3 here) and the frozen field trained too."""
    model = _Kernel(jnp.array(1.0), jnp.array(0.0), jnp.array(2.0))
    loss = lambda m: jnp.sum((m.lengthscale + 3.0) ** 2 + m.offset**2 + m.fixed**2)
    with pytest.raises(ValueError, match="ep.parameterize") as e:
        ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=5, progress=False)
    assert "`lengthscale`" in str(e.value) and "`fixed`" in str(e.value)
    assert "`offset`" not in str(e.value)  # a prior alone: the identity
    # Parameterized, it trains inside the support and the frozen field stays.
    params = ep.parameterize(model)
    trained, _ = ep.fit(
        params, lambda m: loss(ep.resolve(m)), optimiser=optax.sgd(0.1), steps=50,
        progress=False,
    )  # fmt: skip
    resolved = ep.resolve(trained)
    assert resolved.lengthscale > 0 and resolved.fixed == 2.0


def test_a_raw_library_object_in_the_model_says_wrap_it():
    model = {"prior": distrax.Normal(jnp.array(0.0), jnp.array(1.0)), "x": jnp.ones(2)}
    loss = lambda m: -m["prior"].log_prob(m["x"]).sum()
    with pytest.raises(TypeError, match=r"ep\.FixedDistrax\(Normal") as e:
        ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=5, progress=False)
    assert "['prior']" in str(e.value)


def test_an_unresolved_bijector_in_arithmetic_says_resolve():
    node = ep.positive(2.0)
    for use in (
        lambda: node + 1.0,
        lambda: 1.0 - node,
        lambda: node * node,
        lambda: -node,
        lambda: jnp.exp(node),  # pyright: ignore[reportArgumentType]  (the point)
        lambda: node**2,
    ):
        with pytest.raises(TypeError, match=r"ep\.resolve"):
            use()
    with pytest.raises(TypeError, match=r"ep\.resolve"):
        ep.fit(node, lambda s: (s - 1.0) ** 2, optimiser=optax.sgd(0.1), steps=5,
               progress=False)  # fmt: skip


def test_fit_state_is_all_leaves_and_init_is_the_fresh_start():
    model, opt = _model(), optax.adam(0.05)
    state = ep.FitState.init(model, opt)
    assert all(eqx.is_array(x) for x in jax.tree.leaves(state))
    assert int(state.step) == 0
    fresh = ep.fit(model, _loss, optimiser=opt, steps=30, progress=False)
    given = ep.fit(model, _loss, optimiser=opt, steps=30, progress=False, state=state)
    for a, b in zip(jax.tree.leaves(fresh), jax.tree.leaves(given)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="does not match"):
        ep.fit(jnp.zeros(3), lambda x: jnp.sum(x**2), optimiser=opt, steps=2,
               progress=False, state=state)  # fmt: skip


_CHECKPOINT = """
import sys
import equinox as eqx, jax, jax.numpy as jnp, numpy as np, optax
import eqxprob as ep

data = jnp.linspace(-1.0, 2.0, 40)
model = {"loc": jnp.array(0.0), "scale": ep.positive(1.0)}

def loss(m, batch, key):
    m = ep.resolve(m)
    z = (batch - m["loc"]) / m["scale"]
    return jnp.mean(0.5 * z**2 + jnp.log(m["scale"])) + 0.01 * jax.random.normal(key)

kw = dict(optimiser=optax.adam(0.05), data=data, batch_size=7,
          key=jax.random.key(3), progress=False)
skeleton = (model, ep.FitState.init(model, kw["optimiser"]))
if sys.argv[1] == "save":
    m, losses, state = ep.fit(model, loss, steps=37, return_state=True, **kw)
    eqx.tree_serialise_leaves(sys.argv[2], (m, state))
    np.save(sys.argv[3], np.asarray(losses))
else:
    m, state = eqx.tree_deserialise_leaves(sys.argv[2], skeleton)
    m, losses = ep.fit(m, loss, steps=63, state=state, **kw)
    whole, all_losses = ep.fit(model, loss, steps=100, **kw)
    first = np.load(sys.argv[3])
    np.testing.assert_array_equal(np.concatenate([first, losses]), all_losses)
    for a, b in zip(jax.tree.leaves(m), jax.tree.leaves(whole)):
        np.testing.assert_array_equal(a, b)
    print("resumed exactly", int(state.step))
"""


@pytest.mark.slow
def test_a_checkpoint_resumes_in_a_new_process_bit_for_bit(tmp_path):
    """Save (`eqx.tree_serialise_leaves`), a new process, a skeleton from
    `ep.FitState.init`, resume: the losses and model of one long run, bit for
    bit, with minibatches and a per-step key."""
    script = tmp_path / "checkpoint.py"
    script.write_text(_CHECKPOINT)
    paths = [str(tmp_path / "fit.eqx"), str(tmp_path / "losses.npy")]
    run_python(str(script), "save", *paths)
    out = run_python(str(script), "load", *paths).stdout
    assert "resumed exactly 37" in out


@pytest.mark.standard_promotion("the hand-written reference runs optax directly")
@pytest.mark.parametrize(
    "chunk_size", [7, pytest.param(200, marks=pytest.mark.slow), 10_000]
)
def test_a_long_fit_in_uneven_chunks_is_the_hand_written_scan(chunk_size):
    """1,037 steps in chunks of at most `chunk_size` (and a rest), with
    minibatches and a per-step key: the losses and model of one hand-written
    `lax.scan` of the same draws."""
    data = jnp.linspace(-2.0, 3.0, 50)
    key, steps, batch = jax.random.key(7), 1037, 8
    optimiser = optax.adam(0.02)

    def loss(m, b, key):
        return jnp.mean((b - m) ** 2) + 0.1 * jax.random.normal(key) * m

    x, losses = ep.fit(
        jnp.array(0.0), loss, optimiser=optimiser, steps=steps, data=data,
        batch_size=batch, key=key, chunk_size=chunk_size, progress=False,
    )  # fmt: skip
    assert losses.shape == (steps,)
    k_batch, k_loss = jax.random.split(key)

    def body(carry, i):
        m, state = carry
        index = jax.random.randint(jax.random.fold_in(k_batch, i), (batch,), 0, 50)
        value, grad = jax.value_and_grad(loss)(
            m, data[index], jax.random.fold_in(k_loss, i)
        )
        updates, state = optimiser.update(grad, state, m)
        return (optax.apply_updates(m, updates), state), value

    m0 = jnp.array(0.0)
    steps_ = jnp.arange(steps, dtype=jnp.int32)
    (hand_x, _), hand = jax.jit(
        lambda m: jax.lax.scan(body, (m, optimiser.init(m)), steps_)
    )(m0)
    np.testing.assert_allclose(losses, hand, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x, hand_x, rtol=1e-5)


def test_argument_edges_named_clearly():
    loss = lambda m, b: jnp.mean((b - m) ** 2)  # noqa: E731
    kw: dict[str, Any] = dict(optimiser=optax.sgd(0.1), steps=3, progress=False)
    # A batch as large as the data is still drawn with replacement: it needs a
    # key, and a call without a batch and with a key says the key is unused.
    with pytest.raises(ValueError, match="minibatches need a PRNG key"):
        ep.fit(jnp.array(0.0), loss, data=DATA, batch_size=6, **kw)
    with pytest.raises(ValueError, match="Drop `key`"):
        ep.fit(jnp.array(0.0), loss, data=DATA, key=jax.random.key(0), **kw)
    with pytest.raises(ValueError, match="a loss taking `key` needs a PRNG key"):
        ep.fit(jnp.array(0.0), lambda m, key: m**2, **kw)
    # A key used by the batches only, then none: programs of other inputs.
    x, _ = ep.fit(jnp.array(0.0), loss, data=DATA, batch_size=6,
                  key=jax.random.key(0), **kw)  # fmt: skip
    y, _ = ep.fit(jnp.array(0.0), loss, data=DATA, **kw)
    assert np.isfinite(x) and np.isfinite(y)
    with pytest.raises(ValueError, match="chunk_size"):
        ep.fit(jnp.array(0.0), loss, data=DATA, chunk_size=10**8, **kw)
    for bad, error in [(0, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="`chunk_size`"):
            ep.fit(jnp.array(0.0), loss, data=DATA, chunk_size=bad, **kw)
    # A TypeError raised inside the loss is the user's own, not relabelled.
    with pytest.raises(TypeError, match="axs") as e:
        ep.fit(jnp.ones(2), lambda m: jnp.sum(m, axs=0), **kw)  # pyright: ignore[reportCallIssue]
    assert "cannot be called" not in str(e.value)
    with pytest.raises(TypeError, match=r"cannot be called as `loss_fn\(model\)`"):
        ep.fit(jnp.ones(2), lambda m, b: jnp.sum(m), **kw)
    state = ep.FitState.init(jnp.ones(2), kw["optimiser"])
    for step in (-1, 2**31):
        bad = eqx.tree_at(lambda s: s.step, state, np.asarray(step, np.int64))
        with pytest.raises(ValueError, match="state.step"):
            ep.fit(jnp.ones(2), lambda m: jnp.sum(m**2), state=bad, **kw)


def test_a_raw_numpyro_distribution_in_the_model_trains():
    """numpyro's objects are proper pytrees: `fit` accepts them raw."""
    dist = pytest.importorskip("numpyro.distributions")
    model = {"d": dist.Normal(jnp.array(0.0), jnp.array(1.0))}
    data = jnp.array([1.0, 2.0, 3.0])
    loss = lambda m: -jnp.sum(m["d"].log_prob(data))  # noqa: E731
    trained, _ = ep.fit(model, loss, optimiser=optax.adam(0.05), steps=300,
                        progress=False)  # fmt: skip
    np.testing.assert_allclose(trained["d"].loc, 2.0, atol=0.05)


_DUMPED_FIT = """
import jax, jax.numpy as jnp, optax
import eqxprob as ep
def loss(m, b):
    return jnp.mean(jnp.cos(b - m) ** 2)
ep.fit(jnp.array(0.0), loss, optimiser=optax.adam(0.02), steps=100,
       data=jnp.linspace(-2.0, 3.0, 50), batch_size=8, key=jax.random.key(0),
       progress=False, chunk_size=16)
"""


def test_the_compiled_steps_run_in_loops_of_a_static_trip_count(tmp_path):
    """Each compiled chunk (XLA's own dump of the optimised HLO) runs the loss
    in one `while` loop whose trip count XLA knows when it compiles (an
    accelerator then reads no predicate on the host each step): 2 steps, 2
    more, then chunks of 16 (`chunk_size`; fewer if a step took over 1/32 s),
    and the rest, if any."""
    script = tmp_path / "fit.py"
    script.write_text(_DUMPED_FIT)
    dump = tmp_path / "dump"
    flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    run_python(str(script), env={**os.environ, "XLA_FLAGS": flags})
    counts = [
        trip_counts_around(path.read_text(), "cosine")
        for path in dump.glob("*after_optimizations.txt")
    ]
    counts = [c for c in counts if c]
    assert [2] in counts and len(counts) <= 3, counts
    assert all(len(c) == 1 and c[0] is not None and 2 <= c[0] <= 16 for c in counts)


_DUMPED_GP = """
import sys
import jax, jax.numpy as jnp, optax
sys.path.insert(0, sys.argv[1])
import gp_regression
import eqxprob as ep
x, y = gp_regression.make_data(64)
model = ep.parameterize(gp_regression.initial_model())
loss = lambda m: ep.resolve(m).nlml(x, y)
ep.fit(model, loss, optimiser=optax.adam(0.01), steps=36, progress=False, chunk_size=32)
"""


@pytest.mark.slow
def test_the_exact_gp_chunks_carry_only_the_steps_state(tmp_path):
    """The exact GP example's chunks (XLA's dump of the optimised HLO) carry
    through their loops only what a step updates (scalars: the three
    hyperparameters, Adam's moments, the losses), as a hand-written
    `jit(lax.scan)` does: no loop-invariant value hoisted out of the loop (the
    kernel matrix's 64 x 64 masks; carried, such values cost that step 9% on
    the CPU, which XLA did when the chunk kept an unused input)."""
    script = tmp_path / "gp.py"
    script.write_text(_DUMPED_GP)
    dump = tmp_path / "dump"
    flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    examples = str(pathlib.Path(__file__).resolve().parent.parent / "examples")
    run_python(str(script), examples, env={**os.environ, "XLA_FLAGS": flags})
    carries = [
        line.split(" while(")[0]
        for path in dump.glob("*jit_fit_chunk*after_optimizations.txt")
        for line in path.read_text().splitlines()
        if " while(" in line
    ]
    assert carries and not any(re.search(r"\[\d+,\d+\]", c) for c in carries), carries


def test_unknown_keywords_name_what_fit_takes():
    """The spellings of other libraries and typos get "did you mean"."""
    kw: dict[str, Any] = dict(steps=3, progress=False)
    loss = lambda m: jnp.sum(m**2)  # noqa: E731
    for name, value, fix in [
        ("optimizer", optax.sgd(0.1), "did you mean `optimiser=`"),
        ("opt", optax.sgd(0.1), "did you mean `optimiser=`"),
        ("lr", 0.1, r"optimiser=optax.adam\(lr\)"),
        ("batchsize", 2, "did you mean `batch_size=`"),
        ("steps_per_block", 32, "chunks are `lax.scan`s"),
    ]:
        with pytest.raises(TypeError, match=f"keyword argument `{name}`.*{fix}"):
            ep.fit(jnp.ones(2), loss, **{name: value}, **kw)  # pyright: ignore[reportCallIssue]
    with pytest.raises(TypeError, match="`zzz`; it takes optimiser, steps"):
        ep.fit(jnp.ones(2), loss, zzz=1, **kw)  # pyright: ignore[reportCallIssue]


def test_a_model_made_with_x64_on_fitted_with_it_off_names_the_leaves():
    with jax.enable_x64(True):
        model = {"w": jnp.ones(3), "n": jnp.arange(2), "f": jnp.ones(2, jnp.float32)}
    loss = lambda m: jnp.sum(m["w"] ** 2)  # noqa: E731
    with pytest.raises(
        TypeError,
        match=r"64-bit arrays \(`\['n'\]` \(int64\), "
        r"`\['w'\]` \(float64\)\).*jax.enable_x64\(True\)",
    ):
        ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=3, progress=False)
    with jax.enable_x64(True):  # the fix
        trained, _ = ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=3,
                            progress=False)  # fmt: skip
    assert trained["w"].dtype == jnp.float64


def test_a_model_holding_a_prng_key_is_not_taken_for_64_bit():
    """A typed key's dtype has 8 bytes, like float64's, and is no 64-bit array:
    the model fits with `jax_enable_x64` off, its key left as it was."""
    model = {"a": jnp.zeros(2), "k": jax.random.key(3)}
    loss = lambda m: jnp.sum((m["a"] - 1.0) ** 2)  # noqa: E731
    trained, _ = ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=30, progress=False)
    np.testing.assert_allclose(trained["a"], 1 - 0.8**30, rtol=1e-5)
    assert jnp.array_equal(
        jax.random.key_data(trained["k"]), jax.random.key_data(model["k"])
    )


def test_a_float32_float64_mix_names_each_dtypes_paths_and_the_fix():
    """Under strict promotion a loss that adds a float32 parameter to float64 ones
    (or data) fails in JAX without a path; fit's error lists them by dtype."""

    class Two(eqx.Module):
        a: jax.Array
        b: jax.Array

    with jax.enable_x64(True), jax.numpy_dtype_promotion("strict"):
        model = Two(jnp.ones(3, jnp.float32), jnp.ones(2, jnp.float64))
        loss = lambda m, d: jnp.sum(m.a) + jnp.sum(m.b) + jnp.sum(d)  # noqa: E731
        data = {"x": jnp.ones((4, 2), jnp.float64)}
        with pytest.raises(jax.dtypes.TypePromotionError) as info:
            ep.fit(model, loss, optimiser=optax.sgd(0.1), steps=2, data=data,
                   progress=False)  # fmt: skip
        message = str(info.value)
        assert "float32: `model.a`; float64: `model.b`, `data['x']`" in message
        assert "astype(jnp.float64)" in message and "numpy_dtype_promotion" in message
        # One dtype among the inputs: the mix is the loss's own, JAX's error as is.
        same = Two(jnp.ones(3), jnp.ones(2))
        mixed = lambda m: jnp.sum(m.a) + jnp.sum(m.b) + jnp.float32(1.0)  # noqa: E731
        with pytest.raises(jax.dtypes.TypePromotionError, match="^Input dtypes"):
            ep.fit(same, mixed, optimiser=optax.sgd(0.1), steps=2, progress=False)


def test_a_warning_of_the_loss_shows_once_per_call():
    """The loss is traced once a call, however many chunks run (and a chunk
    run again, checked, evaluates that trace, not the loss): float64 data
    asked for with x64 off warns once, not once per chunk."""
    x = np.linspace(0.0, 1.0, 50)

    def loss(m):  # (float64 asked for explicitly: JAX warns and truncates)
        return jnp.mean((m - jnp.asarray(x, dtype=np.float64)) ** 2)

    def warnings_of(steps: int, lr: float) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ep.fit(
                    jnp.array(0.0),
                    loss,
                    optimiser=optax.sgd(lr),
                    steps=steps,
                    progress=False,
                )
            except ep.NonFiniteLossError:
                pass
        return [str(w.message) for w in caught]

    if jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue]
        pytest.skip("x64 is on: float64 is available, nothing warns")
    assert len(warnings_of(40, 0.1)) == 1  # chunks of 2, 2, L, ..., the rest
    assert len(warnings_of(40, 1e30)) == 1  # and a chunk run again, checked


def test_the_progress_bar_says_compiling_then_training(capsys):
    ep.fit(jnp.array(1.0), lambda m: m**2, optimiser=optax.sgd(0.1), steps=20)
    text = capsys.readouterr().err
    assert 0 <= text.index("compiling") < text.rindex("training")
    assert "20/20" in text.rsplit("\r", 1)[-1]  # the bar's last state: every step
