"""Cost per step of `ep.UpdateOnEvent` inside a jitted `lax.scan`.

The inner module is expensive: each call builds a 256x256 SPD matrix from its input,
takes its Cholesky factor and solves against its state. With events on 10% of the
steps, `lax.cond` skips the work on the other 90%, so the time per step should
approach 10% of always updating. Batched events under `jax.vmap` turn the `cond`
into a `select`, which computes both branches: shown for contrast.

Times are the best of several interleaved runs after compilation; ratios are against
the bare inner module measured in the same run. Nothing here is asserted.

Run with `python benchmarks/update_on_event.py`.
"""

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float

import eqxprob as ep


N = 256
STEPS = 200
REPEATS = 15
Matrix = Float[Array, "n n"]
Scalar = Float[Array, ""]


class CholeskySolve(eqx.Module):
    """State `v`; each call solves `(A + (1 + x^2) I) v_new = v + x`."""

    a: Matrix
    index: eqx.nn.StateIndex

    def __init__(self, key):
        b = jax.random.normal(key, (N, N)) / jnp.sqrt(N)
        self.a = b @ b.T
        self.index = eqx.nn.StateIndex(jnp.ones(N))

    def __call__(self, x: Scalar, state: eqx.nn.State) -> tuple[Scalar, eqx.nn.State]:
        v = state.get(self.index)
        matrix = self.a + (1.0 + x**2) * jnp.eye(N)
        factor = jsl.cho_factor(matrix, lower=True)
        v = jsl.cho_solve(factor, v + x)
        v = v / jnp.linalg.norm(v)
        return v.sum(), state.set(self.index, v)


def bare_scan(model, state, events, xs):
    del events

    def step(state, x):
        out, state = model(x, state)
        return state, out

    return jax.lax.scan(step, state, xs)


def wrapped_scan(model, state, events, xs):
    def step(state, inputs):
        out, state = model(*inputs, state)
        return state, out

    return jax.lax.scan(step, state, (events, xs))


def vmapped_scan(model, state, events, xs):
    # A batch of one: the event is batched, so JAX turns `cond` into `select`.
    def step(state, inputs):
        event, x = inputs
        out, state = jax.vmap(model)(event[None], x[None], state)
        return state, out[0]

    state = jax.tree_util.tree_map(lambda a: a[None], state)
    return jax.lax.scan(step, state, (events, xs))


def per_step_times(runs) -> list[float]:
    """Best of `REPEATS` interleaved rounds, in seconds per scan step, for each run.

    The minimum (not the mean) and interleaving keep the table stable on a shared,
    busy machine: other load only ever adds time.
    """
    compiled = []
    for fn, *args in runs:
        fn = eqx.filter_jit(fn)
        jax.block_until_ready(fn(*args))  # compile
        compiled.append((fn, args))
    best = [np.inf] * len(runs)
    for _ in range(REPEATS):
        for i, (fn, args) in enumerate(compiled):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best[i] = min(best[i], time.perf_counter() - start)
    return [t / STEPS for t in best]


def main() -> None:
    key_model, key_x, key_events = jax.random.split(jax.random.key(0), 3)
    xs = jax.random.normal(key_x, (STEPS,))
    sometimes = jax.random.uniform(key_events, (STEPS,)) < 0.1
    always = jnp.ones(STEPS, dtype=bool)
    never = jnp.zeros(STEPS, dtype=bool)

    bare, bare_state = eqx.nn.make_with_state(CholeskySolve)(key_model)
    model, state = eqx.nn.make_with_state(ep.UpdateOnEvent)(
        CholeskySolve(key_model), jnp.array(0.0)
    )

    rows = [
        ("bare inner module (baseline)", "100%", bare_scan, bare, bare_state, always),
        ("UpdateOnEvent, events always", "100%", wrapped_scan, model, state, always),
        ("UpdateOnEvent, events 10%", "10%", wrapped_scan, model, state, sometimes),
        ("UpdateOnEvent, events never", "0%", wrapped_scan, model, state, never),
        (
            "UpdateOnEvent, 10%, vmapped",
            "select",
            vmapped_scan,
            model,
            state,
            sometimes,
        ),
    ]
    times = per_step_times([(fn, m, st, ev, xs) for _, _, fn, m, st, ev in rows])
    print(
        f"inner module: {N}x{N} Cholesky + solve; {STEPS} jitted scan steps; "
        f"events fire on {int(sometimes.sum())}/{STEPS} steps in the 10% rows"
    )
    print(f"{'variant':<32}{'work':>8}{'us/step':>11}{'ratio':>8}")
    for (name, work, *_), t in zip(rows, times):
        print(f"{name:<32}{work:>8}{t * 1e6:>11.1f}{t / times[0]:>8.2f}")


if __name__ == "__main__":
    main()
