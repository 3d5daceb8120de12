"""`fit`: train a model with gradients + optax, in compiled chunks of steps.

One program serves every call with the same model structure, loss and optimiser:
a chunk is a `lax.fori_loop` whose trip count is an argument, so neither `steps`
nor the chunk lengths (chosen at run time so the progress bar moves about four
times a second) compile anything new. The loss and optimiser are compared by
structure (`_hashing.Keyed`), so a fresh but equal `lambda` or `optax.adam(...)`
reuses the compiled program too.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from ._hashing import Keyed
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

    def __init__(
        self, message: str, step: int, model: PyTree, losses: Float[Array, " steps"]
    ):
        super().__init__(message)
        self.step = step
        self.model = model
        self.losses = losses


class FitState(eqx.Module):
    """Where a fit stopped: the optimiser state and the number of steps taken.

    Returned by `ep.fit(..., return_state=True)`; pass it back as
    `ep.fit(..., state=state)` to continue with the same optimiser state and the
    same per-step keys, exactly as one longer run would.

    **Example:**

    ```python
    import jax.numpy as jnp
    import optax
    import eqxprob as ep

    loss = lambda x: jnp.sum((x - 3.0) ** 2)
    opt = optax.adam(0.1)
    a, _, state = ep.fit(jnp.zeros(2), loss, optimiser=opt, steps=20,
                         progress=False, return_state=True)
    a, _ = ep.fit(a, loss, optimiser=opt, steps=30, progress=False, state=state)
    b, _ = ep.fit(jnp.zeros(2), loss, optimiser=opt, steps=50, progress=False)
    assert jnp.allclose(a, b)
    ```
    """

    opt_state: PyTree
    step: int = eqx.field(static=True)


class _Problem:
    """The static part of a fit: loss, optimiser and how batches and keys reach
    the loss. Hashed and compared by structure (see `_hashing`)."""

    __slots__ = ("loss", "optimiser", "batch_size", "rows", "takes_key", "_k")

    def __init__(self, loss_fn, optimiser, batch_size, rows, takes_key):
        self.loss = Keyed(loss_fn)
        self.optimiser = Keyed(optimiser)
        self.batch_size, self.rows, self.takes_key = batch_size, rows, takes_key
        self._k = (self.loss, self.optimiser, batch_size, rows, takes_key)

    def __hash__(self) -> int:
        return hash(self._k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Problem) and self._k == other._k

    def value(self, p: PyTree, static: PyTree, data: Any, step: ArrayLike, key: Any):
        """The loss of step `step` at trainable parameters `p`."""
        model = eqx.combine(p, static)
        args: list[Any] = [model]
        if data is not None:
            batch = data
            if self.batch_size is not None:
                batch_key = jax.random.fold_in(key[0], step)
                index = jax.random.randint(batch_key, (self.batch_size,), 0, self.rows)
                batch = jtu.tree_map(lambda d: d[index], data)
            args.append(batch)
        kwargs = {"key": jax.random.fold_in(key[1], step)} if self.takes_key else {}
        return self.loss.value(*args, **kwargs)


def _all_finite(tree: PyTree) -> Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


@eqx.filter_jit
def _init(params: PyTree, optimiser: Keyed) -> PyTree:
    return _strong(optimiser.value.init(params))


def _chunk(
    params: PyTree,
    opt_state: PyTree,
    static: PyTree,
    data: Any,
    key: Any,
    start: ArrayLike,
    length: ArrayLike,
    problem: _Problem,
    capacity: int,
) -> tuple[PyTree, PyTree, Array, Array]:
    """`length` (traced, at most `capacity`) steps from global step `start`:
    params, state, the losses (NaN past `length`) and whether all were finite.

    The loop body is one hand-written step plus the loss's write into the
    buffer; finiteness is checked once per chunk, and `fit` replays a chunk that
    was not finite to find the step that broke.
    """
    optimiser = problem.optimiser.value

    def body(i: Array, carry: tuple) -> tuple:
        p, state, losses = carry

        def loss(q: PyTree) -> Array:
            return problem.value(q, static, data, start + i, key)

        value, grads = jax.value_and_grad(loss)(p)
        updates, state = optimiser.update(
            grads, state, p, value=value, grad=grads, value_fn=loss
        )
        return eqx.apply_updates(p, updates), state, losses.at[i].set(value)

    losses = jnp.full((capacity,), jnp.nan, jnp.result_type(float))
    params, opt_state, losses = jax.lax.fori_loop(
        0, length, body, (params, opt_state, losses)
    )
    done = jnp.arange(capacity) < length
    finite = jnp.all(jnp.isfinite(losses) | ~done) & _all_finite(params)
    return params, opt_state, losses, finite


_run_chunk = eqx.filter_jit(_chunk)


class _Skeleton:
    """The non-array part of a chunk's inputs, hashed and compared by value: a
    static argument of `jax.jit`, so each chunk is a plain `jax.jit` call on the
    arrays (C++ dispatch) rather than an `eqx.filter_jit` one, which re-partitions
    its arguments every call."""

    __slots__ = ("tree", "_key")

    def __init__(self, tree: Any):
        self.tree = tree
        leaves, treedef = jtu.tree_flatten(tree)
        self._key = (treedef, tuple(leaves))
        hash(self._key)  # a TypeError here: take the `eqx.filter_jit` path

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Skeleton) and self._key == other._key


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _run_arrays(arrays, start, length, skeleton, problem, capacity):
    params, opt_state, *rest = arrays
    static, data, keys = eqx.combine(tuple(rest), skeleton.tree)
    return _chunk(
        params, opt_state, static, data, keys, start, length, problem, capacity
    )


def _runner(static, data, keys, problem, capacity, opt_state) -> Callable:
    """`run(params, opt_state, start, length)`: one compiled chunk."""
    fixed, skeleton_tree = eqx.partition((static, data, keys), eqx.is_array)
    skeleton = None  # Equinox's path, for unhashable statics or odd optimiser states
    if all(eqx.is_array(x) for x in jtu.tree_leaves(opt_state)):
        try:
            skeleton = _Skeleton(skeleton_tree)
        except TypeError:
            pass

    def run(p: PyTree, s: PyTree, start: ArrayLike, length: ArrayLike) -> tuple:
        start, length = np.asarray(start, np.int32), np.asarray(length, np.int32)
        if skeleton is None:
            return _run_chunk(
                p, s, static, data, keys, start, length, problem, capacity
            )
        arrays = (p, s, *fixed)
        return _run_arrays(arrays, start, length, skeleton, problem, capacity)

    return run


def fit(
    model: PyTree,
    loss_fn: Callable[..., Float[Array, ""]],
    *,
    optimiser: optax.GradientTransformation,
    steps: int,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool = True,
    chunk_size: int = 10_000,
    state: FitState | None = None,
    return_state: bool = False,
) -> (
    tuple[PyTree, Float[Array, " steps"]]
    | tuple[PyTree, Float[Array, " steps"], FitState]
):
    """Minimise `loss_fn` over the trainable parameters of `model` with optax.

    The model is split with `ep.trainable`: only the unconstrained `param` of each
    `ep.Bijector` and plain float arrays reach the optimiser, so frozen values and a
    transform's own arrays (bounds) never move, weight decay included. Steps run
    in compiled chunks (a `lax.fori_loop`) whose lengths are chosen at run time so
    that the progress bar moves about four times a second.

    **The loss.** `loss_fn(model)`, or `loss_fn(model, batch)` with `data`; add a
    keyword parameter named `key` (`loss_fn(model, key)`, `loss_fn(model, batch,
    key)`) for a stochastic objective such as an ELBO: each step then gets a fresh
    key, `jax.random.fold_in(k, step)`, reproducible from `fit`'s `key` and
    independent of the chunk lengths. It must return a real floating-point scalar.

    **Minibatches.** With `data` and `batch_size`, each step draws `batch_size`
    rows uniformly **with replacement** (`jax.random.randint`): O(batch) per step
    whatever the number of rows (a draw without replacement costs a permutation of
    every row), and every row is equally likely, so a loss that scales a batch sum
    by `rows / batch_size` is unbiased.

    **Compilation.** One program per model structure (and dtype), data shapes,
    batch size, loss and optimiser. The loss and optimiser compare by structure
    (code, closure and global values), so a fresh but equal `lambda` or
    `optax.adam(1e-3)` does not recompile, and neither does another `steps` or
    `chunk_size` below the same `chunk_size`. A different `chunk_size` does (it is
    the loss buffer's length); keep the default.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` holding `ep.Bijector`s (resolve
      them inside `loss_fn` with `ep.resolve`).
    - `loss_fn`: as above.
    - `optimiser`: an optax `GradientTransformation` (called: `optax.adam(1e-2)`).
      Optimisers that need the loss value or function (`optax.lbfgs`, line
      searches, `optax.contrib.reduce_on_plateau`) get `value=`, `grad=` and
      `value_fn=` (the same batch and key).
    - `steps`: number of optimisation steps (a positive integer).
    - `data`: optional PyTree of arrays sharing a leading (row) axis.
    - `batch_size`: rows per step (needs `data`); `None` uses all rows.
    - `key`: a PRNG key, for minibatches and for a loss taking `key`.
    - `progress`: show a `tqdm.auto` bar (terminal or notebook) on stderr with the
      loss; `False` for none.
    - `chunk_size`: the most steps per compiled call.
    - `state`: a `FitState` from an earlier `fit`, to continue it.
    - `return_state`: also return the `FitState` reached.

    **Returns:**

    `(trained_model, losses)` (and the `FitState` with `return_state=True`), with
    `losses[i]` the loss at the start of step `i`. On `KeyboardInterrupt` nothing
    is lost: `fit` warns and returns the model and losses of the steps finished so
    far (`len(losses) < steps`).

    **Raises:**

    `ep.NonFiniteLossError` when a loss or gradient is not finite (with the step,
    the model with its last finite parameters, and the losses so far);
    `TypeError`/`ValueError` naming the argument for a model with nothing to
    train, a loss that does not return a real scalar or reads no trainable
    parameter, an optimiser that was not called, and the like.

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
    steps = _check_int("steps", steps)
    chunk_size = _check_int("chunk_size", chunk_size)
    _check_optimiser(optimiser)
    if progress not in (True, False):
        raise TypeError(f"fit: `progress` must be True or False, got {progress!r}.")
    if state is not None and not isinstance(state, FitState):
        raise TypeError(
            "fit: `state` must be the `FitState` returned by "
            f"`ep.fit(..., return_state=True)`, got {type(state).__name__}."
        )
    takes_key = _takes_key(loss_fn)
    rows = None
    if data is None:
        if batch_size is not None:
            raise ValueError(
                "fit: `batch_size` needs `data` (a PyTree of arrays with a row axis)."
            )
    else:
        rows = _check_data(data)
        # NumPy rows are indexed by traced minibatch indices: make them JAX arrays.
        data = jtu.tree_map(
            lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, data
        )
        if batch_size is not None:
            batch_size = _check_int("batch_size", batch_size)
            if batch_size > rows:
                raise ValueError(
                    f"fit: `batch_size` ({batch_size}) is more than the number of "
                    f"rows in `data` ({rows})."
                )
            if batch_size == rows:
                batch_size = None
    needs_key = batch_size is not None or takes_key
    if needs_key and key is None:
        why = "minibatches" if batch_size is not None else "a loss taking `key`"
        raise ValueError(f"fit: {why} need a PRNG key: pass `key=jax.random.key(0)`.")
    if key is not None and not needs_key:
        raise ValueError(
            "fit: `key` is used only for minibatches (`data` with `batch_size`) or "
            "by a loss with a `key` parameter; this call has neither. Drop `key`, "
            "or add `key` to the loss's parameters."
        )
    # `needs_key` implies a key (checked above).
    keys = tuple(jax.random.split(key)) if needs_key else None  # pyright: ignore[reportArgumentType]

    params, static = eqx.partition(model, trainable(model))
    # Strong dtypes in, strong dtypes out: otherwise weakly typed inputs (e.g.
    # `jnp.array(0.0)`) compile the chunk a second time.
    params = _strong(params)
    if not jtu.tree_leaves(params):
        raise ValueError(
            "fit: the model has nothing to train: no float arrays outside "
            "`ep.Frozen` nodes. Python floats and ints are static (never trained): "
            "pass `jnp.asarray(1.0)`, e.g. `ep.FixedDistrax(distrax.Normal, "
            "jnp.asarray(0.0), jnp.asarray(1.0))`."
        )
    problem = _Problem(loss_fn, optimiser, batch_size, rows, takes_key)
    _check_loss(problem, params, static, data, keys)
    if state is None:
        opt_state = _init(params, problem.optimiser)
    else:
        expected = jax.eval_shape(optimiser.init, params)
        got = jax.eval_shape(lambda s: s, state.opt_state)
        if jtu.tree_structure(expected) != jtu.tree_structure(got) or any(
            (a.shape, a.dtype) != (b.shape, b.dtype)
            for a, b in zip(jtu.tree_leaves(expected), jtu.tree_leaves(got))
        ):
            raise ValueError(
                "fit: `state` does not match this model and optimiser (its "
                "optimiser state has another structure, shape or dtype). Pass the "
                "`FitState` of a fit of the same model with the same optimiser."
            )
        opt_state = state.opt_state
    params, opt_state = _place_like((params, opt_state), data)
    first = 0 if state is None else state.step

    run = _runner(static, data, keys, problem, chunk_size, opt_state)

    bar = _progress_bar(progress, steps)
    losses: list[np.ndarray] = []
    # The first chunk (which also compiles) is short, so the bar appears at once;
    # later ones last about `target` seconds, at most `chunk_size` steps.
    done, length, target = 0, min(steps, 100, chunk_size), 0.25
    try:
        while done < steps:
            length = min(length, steps - done)
            began = time.perf_counter()
            new_params, new_state, chunk, finite = run(
                params, opt_state, first + done, length
            )
            chunk = np.asarray(chunk)[:length]
            if not bool(finite):
                _raise_non_finite(
                    run, params, opt_state, first + done, chunk, losses, static, first
                )
            params, opt_state = new_params, new_state
            losses.append(chunk)
            done += length
            if bar is not None:
                bar.update(length)
                bar.set_postfix(loss=f"{float(chunk[-1]):.6g}")
            per_step = (time.perf_counter() - began) / length
            # (The first chunk's time may include compiling: a shorter next one.)
            length = int(np.clip(target / max(per_step, 1e-9), 1, chunk_size))
    except (KeyboardInterrupt, jax.errors.JaxRuntimeError) as e:
        # A Ctrl-C that lands inside a host callback reaches us wrapped by XLA.
        if not isinstance(e, KeyboardInterrupt) and "KeyboardInterrupt" not in str(e):
            raise
        warnings.warn(
            f"fit: interrupted after {done} of {steps} steps; returning the model "
            "and losses reached so far.",
            stacklevel=2,
        )
    finally:
        if bar is not None:
            bar.close()
    trained = eqx.combine(params, static)
    history = np.concatenate(losses) if losses else np.zeros((0,), np.float32)
    history = jax.device_put(history)
    if return_state:
        return trained, history, FitState(opt_state, first + done)
    return trained, history


def _place_like(params: PyTree, data: Any) -> PyTree:
    """Commit the parameters where the data is (replicated over its mesh), or to
    the default device: a compiled chunk returns committed arrays, and a second
    chunk fed those would otherwise compile again for the new placement."""
    leaves = [x for x in jtu.tree_leaves(data) if isinstance(x, jax.Array)]
    sharding = None
    if leaves and getattr(leaves[0], "committed", False):
        sharding = leaves[0].sharding
        if isinstance(sharding, jax.sharding.NamedSharding):
            spec = jax.sharding.PartitionSpec()
            sharding = jax.sharding.NamedSharding(sharding.mesh, spec)
        elif not isinstance(sharding, jax.sharding.SingleDeviceSharding):
            return params
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    leaves, treedef = jtu.tree_flatten(params)
    loose = [
        i
        for i, x in enumerate(leaves)
        if isinstance(x, jax.Array) and not getattr(x, "committed", True)
    ]
    if loose:  # one batched transfer, not one per leaf
        placed = jax.device_put([leaves[i] for i in loose], sharding)
        for i, x in zip(loose, placed):
            leaves[i] = x
    return jtu.tree_unflatten(treedef, leaves)


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"fit: `{name}` must be a positive integer, got {value!r}.")
    if value < 1:
        raise ValueError(f"fit: `{name}` must be a positive integer, got {value!r}.")
    return int(value)


def _check_optimiser(optimiser: Any) -> None:
    if isinstance(optimiser, optax.GradientTransformation):
        return
    if callable(optimiser) and not hasattr(optimiser, "update"):
        name = getattr(optimiser, "__name__", repr(optimiser))
        raise TypeError(
            f"fit: `optimiser` is the function `{name}` itself; call it to build "
            f"the optimiser, e.g. `optimiser=optax.{name}(1e-2)`."
        )
    raise TypeError(
        "fit: `optimiser` must be an optax `GradientTransformation` (e.g. "
        f"`optax.adam(1e-2)`), got {type(optimiser).__name__}."
    )


def _takes_key(loss_fn: Callable) -> bool:
    if not callable(loss_fn):
        raise TypeError(f"fit: `loss_fn` must be callable, got {loss_fn!r}.")
    try:
        parameters = inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False
    return "key" in parameters


_CHECKED: dict[Any, bool] = {}  # what `_check_loss` has accepted, by signature


def _signature(problem: _Problem, tree: Any) -> Any:
    """A hashable key of `tree`'s structure, array shapes and dtypes and other
    leaves, with `problem`; `None` if a leaf is unhashable."""
    leaves, treedef = jtu.tree_flatten(tree)
    parts = tuple(
        (x.shape, x.dtype, getattr(x, "weak_type", False))
        if eqx.is_array(x)
        else ("static", x)
        for x in leaves
    )
    try:
        key = (problem, treedef, parts)
        hash(key)
    except TypeError:
        return None
    return key


def _check_loss(problem: _Problem, params: PyTree, static: PyTree, data, keys):
    """Trace the loss once (no compile) and check that it returns a real scalar;
    remembered per signature, so a repeated call traces nothing."""
    signature = _signature(problem, (params, static, data, keys))
    if signature is not None and signature in _CHECKED:
        return
    _trace_loss(problem, params, static, data, keys)
    if signature is not None:
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[signature] = True


def _trace_loss(problem: _Problem, params: PyTree, static: PyTree, data, keys):
    call = "loss_fn(model" + (", batch" if data is not None else "")
    call += ", key=key)" if problem.takes_key else ")"
    try:
        closed, out = jax.make_jaxpr(
            lambda p: problem.value(p, static, data, jnp.int32(0), keys),
            return_shape=True,
        )(params)
    except TypeError as e:
        if "argument" not in str(e):
            raise
        raise TypeError(
            f"fit: calling `{call}` failed: {e}. With `data`, the loss takes "
            "`(model, batch)`; without, `(model)`; add a `key` parameter for a "
            "fresh key per step."
        ) from e
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"fit: `{call}` must return a scalar array, got "
            f"{type(out).__name__} ({jtu.tree_structure(out)}). Return only the loss."
        )
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"fit: `{call}` must return a real floating-point scalar, got shape "
            f"{out.shape} and dtype {out.dtype}. Reduce it (e.g. `jnp.sum`) and "
            "keep it real (`jnp.real`, `.astype(float)`)."
        )
    if not _depends_on_inputs(closed.jaxpr):
        raise ValueError(
            f"fit: `{call}` does not depend on any trainable parameter of the "
            "model, so training would change nothing (every loss the same). Use "
            "the model's arrays in the loss; Python floats and ints are static, "
            "and `ep.Frozen` values are not trained."
        )


def _depends_on_inputs(jaxpr: Any) -> bool:
    """Whether any input of `jaxpr` is read by an equation or returned (a
    conservative test: an input read only by discarded work counts as used).
    Compared by identity, so literals never match."""
    inputs = {id(v) for v in jaxpr.invars}
    used = [*jaxpr.outvars, *(v for eqn in jaxpr.eqns for v in eqn.invars)]
    return any(id(v) in inputs for v in used)


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
    rows = sizes.pop()
    if rows == 0:
        raise ValueError("fit: `data` has no rows.")
    return rows


def _raise_non_finite(
    run: Callable,
    params: PyTree,
    opt_state: PyTree,
    start: int,
    chunk: np.ndarray,
    losses: list[np.ndarray],
    static: PyTree,
    first: int,
) -> None:
    """Replay a chunk that went non-finite one step at a time, from its start.

    The failing step is the first whose loss, or whose updated parameters (how a
    non-finite gradient shows), is not finite; the model raised with is the one
    at the start of that step. The replay reuses the compiled chunk.
    """
    for i in range(len(chunk)):
        new_params, new_state, _, finite = run(params, opt_state, start + i, 1)
        if not (bool(finite) and np.isfinite(chunk[i])) or i == len(chunk) - 1:
            break
        params, opt_state = new_params, new_state
    # A chunk is never empty, so the loop binds `i`.
    step = start + i - first  # pyright: ignore[reportPossiblyUnboundVariable]
    history = jnp.asarray(np.concatenate([*losses, chunk[: i + 1]]))  # pyright: ignore[reportPossiblyUnboundVariable]
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


def _progress_bar(progress: bool, steps: int) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=steps, unit="step", mininterval=0.25, file=sys.stderr)
