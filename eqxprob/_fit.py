"""`fit`: train a model with gradients + optax, in chunks of `lax.scan` steps."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, PRNGKeyArray, PyTree

from ._parameter import trainable


class NonFiniteLossError(FloatingPointError):
    """Raised by `ep.fit` when the loss or a gradient stops being finite.

    **Attributes:**

    - `step`: the (0-based) step whose loss or gradient was not finite. A
      non-finite gradient is seen as non-finite parameters after its update, so
      an optimiser that repairs it (e.g. `optax.zero_nans()`) trains on.
    - `model`: the model at the start of that step: every parameter is still what
      the last finite step made it.
    - `losses`: the losses of steps `0 .. step` (the last one non-finite unless
      only the gradient was).

    **Example:**

    ```python
    import jax.numpy as jnp
    import optax
    import eqxprob as ep

    try:
        ep.fit(jnp.array(1.0), lambda x: jnp.log(x), optimiser=optax.sgd(2.0),
               steps=10, progress=False)
    except ep.NonFiniteLossError as e:
        print(e.step, e.model)  # 1 -1.0: log(-1) is nan at step 1
    ```
    """

    def __init__(self, message: str, step: int, model: Any, losses: Array):
        super().__init__(message)
        self.step = step
        self.model = model
        self.losses = losses


def _all_finite(tree: PyTree) -> Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


@eqx.filter_jit
def _run_chunk(
    params: PyTree,
    opt_state: PyTree,
    static: PyTree,
    xs: Any,
    loss_fn: Callable,
    optimiser: optax.GradientTransformation,
    data: Any,
    batch_size: int | None,
    length: int,
) -> tuple[PyTree, PyTree, Array, Array]:
    """`length` optimisation steps in one `lax.scan`: params, state, losses, finite.

    The scanned step is exactly a hand-written one (no finiteness checks, no
    selects), so it compiles to the same instructions. `finite` says whether every
    loss and the final parameters are finite; it costs one check per chunk, and
    `fit` replays a chunk that was not to find the step that broke.
    """

    def loss(p: PyTree, batch: Any) -> Array:
        model = eqx.combine(p, static)
        return loss_fn(model) if batch is None else loss_fn(model, batch)

    def step(carry: tuple, key: Any) -> tuple[tuple, Array]:
        p, state = carry
        batch = None
        if data is not None:
            n = jtu.tree_leaves(data)[0].shape[0]
            if batch_size is None or batch_size >= n:
                batch = data
            else:
                index = jax.random.choice(key, n, (batch_size,), replace=False)
                batch = jtu.tree_map(lambda d: d[index], data)
        value, grads = jax.value_and_grad(loss)(p, batch)
        updates, state = optimiser.update(grads, state, p)
        return (eqx.apply_updates(p, updates), state), value

    (params, opt_state), losses = jax.lax.scan(
        step, (params, opt_state), xs, length=length
    )
    finite = jnp.all(jnp.isfinite(losses)) & _all_finite(params)
    return params, opt_state, losses, finite


def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
    *,
    optimiser: optax.GradientTransformation,
    steps: int,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool | Literal["always"] = True,
    chunk_size: int = 100,
) -> tuple[PyTree, Array]:
    """Minimise `loss_fn` over the trainable parameters of `model` with optax.

    The model is split with `ep.trainable`: only the unconstrained `param` of each
    `ep.Bijector` and plain float arrays reach the optimiser, so frozen values and a
    transform's own arrays (bounds) never move, weight decay included. Steps run
    inside `lax.scan` in chunks of `chunk_size`, with the progress bar updated
    between chunks. The scanned step is exactly what you would write by hand (it
    compiles to the same instructions); finiteness is checked once per chunk.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` holding `ep.Bijector`s (resolve
      them inside `loss_fn` with `ep.resolve`).
    - `loss_fn`: `loss_fn(model) -> scalar`, or `loss_fn(model, batch)` when `data`
      is given.
    - `optimiser`: an optax `GradientTransformation`. Pass the same object to
      repeated calls to reuse the compiled steps.
    - `steps`: number of optimisation steps.
    - `data`: optional PyTree of arrays sharing a leading axis. Each step sees a
      minibatch of `batch_size` rows drawn without replacement with `key`, or all
      rows if `batch_size` is None.
    - `key`: a PRNG key, required for minibatches.
    - `progress`: `True` shows a tqdm bar (with the loss) when stdout is a
      terminal, `"always"` shows it anyway, `False` never.
    - `chunk_size`: steps per compiled `lax.scan` chunk.

    **Returns:**

    `(trained_model, losses)` with `losses` of shape `(steps,)`: the loss at the
    start of each step.

    **Raises:**

    `ep.NonFiniteLossError` when a loss or gradient is not finite; it carries the
    step, the model with its last finite parameters, and the losses so far. A
    chunk that went non-finite is replayed one step at a time to find the step
    (this compiles a one-step chunk, on the error path only).

    **Example:**

    ```python
    import jax.numpy as jnp
    import optax
    import eqxprob as ep

    data = jnp.array([1.0, 2.0, 4.0])
    scale = ep.positive(1.0)  # an ep.Bijector: trained in unconstrained space
    loss = lambda s: jnp.sum((ep.resolve(s) - data) ** 2)
    scale, losses = ep.fit(scale, loss, optimiser=optax.adam(0.1), steps=300,
                           progress=False)
    assert jnp.allclose(ep.resolve(scale), data.mean(), atol=1e-3)
    ```
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"fit: `steps` must be a positive int, got {steps!r}.")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"fit: `chunk_size` must be a positive int, got {chunk_size!r}."
        )
    minibatch = data is not None and batch_size is not None
    if minibatch:
        n = _check_data(data)
        if not isinstance(batch_size, int) or not 1 <= batch_size <= n:
            raise ValueError(
                f"fit: `batch_size` must be an int between 1 and the number of rows "
                f"({n}), got {batch_size!r}."
            )
        if key is None:
            raise ValueError(
                "fit: minibatches need a PRNG key: pass `key=jax.random.PRNGKey(0)` "
                "(or `batch_size=None` for full-batch training)."
            )
    elif data is not None:
        _check_data(data)

    params, static = eqx.partition(model, trainable(model))
    # Strong dtypes in, strong dtypes out: otherwise weakly typed inputs (e.g.
    # `jnp.array(0.0)`) compile the chunk a second time.
    params = _strong(params)
    opt_state = _strong(optimiser.init(params))
    batch = batch_size if minibatch else None

    def run(p: PyTree, state: PyTree, xs: Any, length: int) -> tuple:
        return _run_chunk(p, state, static, xs, loss_fn, optimiser, data, batch, length)

    keys = jax.random.split(key, steps) if minibatch else None
    bar = _progress_bar(progress, steps)
    losses: list[Array] = []
    done = 0
    try:
        while done < steps:
            length = min(chunk_size, steps - done)
            xs = None if keys is None else keys[done : done + length]
            new_params, new_state, chunk, finite = run(params, opt_state, xs, length)
            if not bool(finite):
                _raise_non_finite(
                    run, params, opt_state, xs, chunk, done, losses, static
                )
            params, opt_state = new_params, new_state
            losses.append(chunk)
            done += length
            if bar is not None:
                bar.update(length)
                bar.set_postfix(loss=f"{float(chunk[-1]):.6g}")
    finally:
        if bar is not None:
            bar.close()
    return eqx.combine(params, static), jnp.concatenate(losses)


def _strong(tree: PyTree) -> PyTree:
    """Drop weak types: `x.astype(x.dtype)` returns a strongly typed array."""
    return jtu.tree_map(lambda x: x.astype(x.dtype) if eqx.is_array(x) else x, tree)


def _check_data(data: PyTree) -> int:
    leaves = jtu.tree_leaves(data)
    if not leaves or not all(eqx.is_array(x) and x.ndim >= 1 for x in leaves):
        raise ValueError(
            "fit: `data` must be a PyTree of arrays with a leading (row) axis."
        )
    sizes = {x.shape[0] for x in leaves}
    if len(sizes) != 1:
        raise ValueError(
            f"fit: every array in `data` must have the same number of rows, got "
            f"{sorted(sizes)}."
        )
    return sizes.pop()


def _raise_non_finite(
    run: Callable,
    params: PyTree,
    opt_state: PyTree,
    xs: Any,
    chunk: Array,
    done: int,
    losses: list[Array],
    static: PyTree,
) -> None:
    """Replay a chunk that went non-finite one step at a time, from its start.

    The failing step is the first whose loss, or whose updated parameters (how a
    non-finite gradient shows), is not finite; the model raised with is the one
    at the start of that step. Only this error path compiles a one-step chunk.
    """
    chunk = np.asarray(chunk)
    for i in range(len(chunk)):
        x = None if xs is None else xs[i : i + 1]
        new_params, new_state, _, finite = run(params, opt_state, x, 1)
        if not (bool(finite) and np.isfinite(chunk[i])) or i == len(chunk) - 1:
            break
        params, opt_state = new_params, new_state
    step = done + i
    history = jnp.concatenate([*losses, jnp.asarray(chunk[: i + 1])])
    raise NonFiniteLossError(
        f"fit: the loss or its gradient is not finite at step {step} "
        f"(loss = {float(history[-1])}). Training stopped; the model with the last "
        "finite parameters is attached as `error.model`. Lower the learning rate, "
        "check the loss for log/sqrt of non-positive values, or constrain the "
        "parameters (e.g. `ep.positive`).",
        step=step,
        model=eqx.combine(params, static),
        losses=history,
    )


def _progress_bar(progress: bool | str, steps: int) -> Any:
    if progress is False or (progress is True and not sys.stdout.isatty()):
        return None
    if progress not in (True, "always"):
        raise ValueError(
            f"fit: `progress` must be True, False or 'always', got {progress!r}."
        )
    from tqdm.auto import tqdm

    return tqdm(total=steps, unit="step", mininterval=0.2, file=sys.stdout)
