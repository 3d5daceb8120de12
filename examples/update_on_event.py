"""Online running mean and variance, updated only when a new observation arrives.

A sensor reports on some steps only; on the other steps its reading is missing (nan).
`ep.UpdateOnEvent` runs Welford's update on the steps that have data and, on every
other step, returns the previous estimate without touching the running statistics, so
the missing readings never reach them. Everything runs in one jitted `lax.scan`.

Run with `python examples/update_on_event.py`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

import eqxprob as ep


Scalar = Float[Array, ""]


class RunningMoments(eqx.Module):
    """Welford's online mean and variance. State: (count, mean, sum of squares)."""

    index: eqx.nn.StateIndex

    def __init__(self):
        zero = jnp.zeros((), jnp.float32)
        self.index = eqx.nn.StateIndex((zero, zero, zero))

    def __call__(
        self, x: Scalar, state: eqx.nn.State
    ) -> tuple[dict[str, Scalar], eqx.nn.State]:
        count, mean, m2 = state.get(self.index)
        count = count + 1
        delta = x - mean
        mean = mean + delta / count
        m2 = m2 + delta * (x - mean)
        variance = jnp.where(count > 1, m2 / jnp.maximum(count - 1, 1), jnp.nan)
        state = state.set(self.index, (count, mean, m2))
        return {"n": count, "mean": mean, "var": variance}, state


def main() -> None:
    steps = 12
    key_data, key_events = jax.random.split(jax.random.key(0))
    readings = 5.0 + 2.0 * jax.random.normal(key_data, (steps,))
    arrived = jax.random.bernoulli(key_events, 0.4, (steps,)).at[0].set(False)
    readings = jnp.where(arrived, readings, jnp.nan)  # missing readings are nan

    # Before the first reading: no observations, unknown mean and variance.
    before = {"n": 0.0, "mean": jnp.nan, "var": jnp.nan}
    model, state = eqx.nn.make_with_state(ep.UpdateOnEvent)(
        RunningMoments(), jnp.array(0.0), initial_output=before
    )

    @eqx.filter_jit
    def run(model, state, arrived, readings):
        def step(state, inputs):
            event, x = inputs
            estimate, state = model(event, x, state)
            return state, estimate

        return jax.lax.scan(step, state, (arrived, readings))

    _, estimates = run(model, state, arrived, readings)

    header = ("step", "new data", "reading", "n", "mean", "var")
    print("{:>4}  {:>8}  {:>8}  {:>3}  {:>7}  {:>7}".format(*header))
    for t in range(steps):
        print(
            f"{t:>4}  {'yes' if arrived[t] else '-':>8}  {float(readings[t]):>8.3f}  "
            f"{float(estimates['n'][t]):>3.0f}  {float(estimates['mean'][t]):>7.3f}  "
            f"{float(estimates['var'][t]):>7.3f}"
        )
    seen = readings[arrived]
    print(
        f"check: mean/var of the {seen.size} readings = "
        f"{float(seen.mean()):.3f} / {float(seen.var(ddof=1)):.3f}"
    )


if __name__ == "__main__":
    main()
