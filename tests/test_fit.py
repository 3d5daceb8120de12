"""`ep.fit` against hand-written optax loops."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

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
    optimiser = optax.adam(0.05)
    traces = []

    def loss(model):
        traces.append(None)
        return _loss(model)

    ep.fit(_model(), loss, optimiser=optimiser, steps=20, progress=False, chunk_size=10)
    count = len(traces)
    ep.fit(_model(), loss, optimiser=optimiser, steps=30, progress=False, chunk_size=10)
    assert len(traces) == count


def test_minibatches_are_drawn_from_the_data_with_the_key():
    data = jnp.arange(12.0)
    seen = []

    def loss(model, batch):
        jax.debug.callback(lambda b: seen.append(np.asarray(b)), batch)
        return jnp.mean((batch - model) ** 2)

    model, losses = ep.fit(
        jnp.array(0.0),
        loss,
        optimiser=optax.sgd(0.02),
        steps=300,
        data=data,
        batch_size=4,
        key=jax.random.PRNGKey(0),
        progress=False,
    )
    assert losses.shape == (300,)
    assert all(b.shape == (4,) and len(set(b.tolist())) == 4 for b in seen)
    assert set(np.concatenate(seen).tolist()) == set(data.tolist())
    np.testing.assert_allclose(model, data.mean(), atol=0.5)
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


def test_non_finite_loss_with_minibatches_replays_the_same_batches():
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

    # One step a chunk needs no replay; a replay with other batches would stop
    # elsewhere or with another model.
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


def test_non_finite_gradient_at_the_very_last_step_is_caught():
    # x_k = 1 - 0.1 k; the gradient is nan from x_8 = 0.2 on, at step 8 of 9: every
    # loss is finite, only the final parameters are not.
    with pytest.raises(ep.NonFiniteLossError, match="at step 8") as info:
        ep.fit(
            jnp.array(1.0),
            _nan_gradient_below(0.25),
            optimiser=optax.sgd(0.1),
            steps=9,
            progress=False,
            chunk_size=3,
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


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"steps": 0}, "`steps` must be a positive int"),
        ({"steps": 5, "data": DATA, "batch_size": 3}, "need a PRNG key"),
        ({"steps": 5, "data": DATA, "batch_size": 10, "key": 0}, "`batch_size` must"),
        ({"steps": 5, "data": {"a": DATA, "b": DATA[:2]}}, "same number of rows"),
        ({"steps": 5, "progress": "yes"}, "`progress` must be"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ep.fit(jnp.array(0.0), lambda m, *b: m**2, optimiser=optax.sgd(0.1), **kwargs)
