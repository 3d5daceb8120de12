"""`fit`: minimise a loss over a model's trainable parameters with optax.

Its one idea: a training loop that trains what the code says now. Each call
traces the user's loss once, checks that trace, and runs pure steps (one
optimiser update, its batch and key from the global step number) in compiled
chunks: blocks of steps in a `lax.scan`, so the step loop's trip count is
static, inside a `while_loop` over the blocks. `_programs` reuses a compiled
chunk only for an identical lowering. Between chunks `fit` shows progress,
stops on Ctrl-C, and runs a chunk that went non-finite again one step at a time
to find its step. Under a JAX transformation the steps are one `lax.scan` in
the caller's program instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
import time
import warnings
from collections.abc import Callable
from typing import Any, Literal, overload

import equinox as eqx
import jax
import jax.core
import jax.extend.core as jex
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jax.experimental import multihost_utils
from jaxtyping import Array, PRNGKeyArray, PyTree

from . import _programs, _sharding
from ._families import family_of_instance, is_raw
from ._metadata import label_of, unparameterized
from ._parameter import trainable


# XLA hoists loop-invariant work out of a loop of unknown trip count, as the
# chunk's is, but not out of a `lax.scan`'s: the hoisted values, carried through
# the loop, added a quarter to the exact GP example's compile (XLA's own compile
# events, `benchmarks/peers.py`) and saved no step time. Compiled as a scan is.
_CHUNK_OPTIONS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def _block(leaves: list, steps: int, steps_per_block: int | None) -> int:
    """Steps per block, the step loop's static trip count: `steps_per_block`, or
    by default 32 on an accelerator for a call of at least 1,000 steps, else 1.
    An accelerator reads a dynamic loop's predicate on the host, once a step; a
    block pays that round trip once, but the last block of a call computes up
    to 31 steps it discards (at most 3% here). XLA:CPU runs on the host, where
    one step per block is fastest (measured: `docs/performance.md`)."""
    if steps_per_block is not None:
        return steps_per_block
    devices = (next(iter(x.devices())) for x in leaves if isinstance(x, jax.Array))
    platform = next((d.platform for d in devices), jax.default_backend())
    return 1 if platform == "cpu" or steps < 1000 else 32


class NonFiniteLossError(FloatingPointError):
    """Raised by `ep.fit` when the loss or a gradient stops being finite.

    **Attributes:**

    - `step`: the (0-based) step of this call whose loss or gradient was not
      finite. A non-finite gradient is seen as non-finite parameters after its
      update, so an optimiser that repairs it (`optax.zero_nans()`) trains on,
      and one that applies gradients later (`optax.MultiSteps`) shows it at the
      step that applies it (its state, which holds it until then, is not
      checked).
    - `model`: the model at the start of that step.
    - `losses`: the losses of steps `0 .. step`.

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


class FitState(eqx.Module):
    """Where a fit stopped: the optimiser state and the number of steps taken.

    Both are array leaves, so `eqx.tree_serialise_leaves` saves all of it.
    `FitState.init(model, optimiser)` is the state a fit starts from (and a
    skeleton to deserialise into); `ep.fit(..., return_state=True)` returns the
    state reached, and `ep.fit(..., state=state)` continues from it, with the
    same per-step keys and batches, exactly as one longer run would.

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
    assert jnp.array_equal(a, b)
    ```
    """

    opt_state: Any
    step: Array

    @classmethod
    def init(cls, model: PyTree, optimiser: Any) -> FitState:
        """The state before the first step: `optimiser.init` of the model's
        trainable parameters (`ep.trainable`), step 0."""
        params, _ = eqx.partition(model, trainable(model))
        return cls(_init(_optimiser(optimiser), _strong(params)), jnp.int32(0))


def _init(optimiser: optax.GradientTransformation, params: PyTree) -> PyTree:
    with jax.numpy_dtype_promotion("standard"):  # (optax is not strict-clean)
        return _strong(optimiser.init(params))


def _strong(tree: PyTree) -> PyTree:
    """Weak types dropped (a weakly typed input would compile a second program);
    concrete arrays through NumPy, which compiles nothing."""

    def leaf(x: Any) -> Any:
        if not getattr(x, "weak_type", False):
            return x
        if isinstance(x, jax.core.Tracer):
            return x.astype(x.dtype)
        return jax.device_put(np.asarray(x), x.sharding if x.committed else None)

    return jtu.tree_map(leaf, tree)


def _aval(x: Any) -> tuple:
    return tuple(x.shape), x.dtype


@dataclasses.dataclass(frozen=True)
class _Problem:
    """What a step reads besides the arrays: the loss, the optimiser, the
    model's non-array part, and how batches and keys reach the loss."""

    loss: Callable
    optimiser: optax.GradientTransformation
    batch_size: int | None
    rows: int  # (0 without data)
    takes_key: bool
    call: str  # how `fit` calls the loss, for messages
    promotion: str  # the dtype promotion in force where `fit` was called
    skeleton: PyTree = None
    # The loss's one trace in this call (`_trace_loss`), a closed jaxpr of
    # `value`'s arrays (its constants may be an outer transformation's tracers).
    # The steps evaluate it rather than tracing the user's code again, which
    # could read other state (a random draw, say).
    traced: Any = None
    avals: tuple = ()  # (shape, dtype) of each of the traced jaxpr's inputs

    def value(self, params, fixed, data, keys, step):
        """The loss of global step `step` at the trainable `params`."""
        leaves = jtu.tree_leaves((params, fixed, data, keys, step))
        if tuple(map(_aval, leaves)) == self.avals:
            return jex.jaxpr_as_fun(self.traced)(*leaves)[0]
        # (Not the traced inputs: a line search's trial parameters, promoted by
        # `params + stepsize * updates`. The loss, traced again, as optax does.)
        args: list[Any] = [eqx.combine(params, fixed, self.skeleton)]
        if data is not None:
            if self.batch_size is not None:
                index = jax.random.randint(
                    jax.random.fold_in(keys[0], step), (self.batch_size,), 0, self.rows
                )
                data = jtu.tree_map(lambda d: _sharding.rows(d, index), data)
            args.append(data)
        kwargs = {"key": jax.random.fold_in(keys[1], step)} if self.takes_key else {}
        with jax.numpy_dtype_promotion(self.promotion):
            return self.loss(*args, **kwargs)

    def step(self, params, opt_state, fixed, data, keys, step):
        """One update: `(params, opt_state, loss)` after global step `step`."""
        loss = lambda p: self.value(p, fixed, data, keys, step)
        value, grads = jax.value_and_grad(loss)(params)
        # (A plain `GradientTransformation` takes no `value=`, `grad=`,
        # `value_fn=`: optax's wrapper drops them.)
        optimiser = optax.with_extra_args_support(self.optimiser)
        with jax.numpy_dtype_promotion("standard"):  # (optax is not strict-clean)
            updates, opt_state = optimiser.update(
                grads, opt_state, params, value=value, grad=grads, value_fn=loss
            )
            # (Cast back to each parameter's dtype: an update in another dtype,
            # from `mu_dtype=` or a float64 learning rate, say.)
            params = optax.apply_updates(params, updates)
        return params, _strong(opt_state), value.astype(jnp.result_type(float))

    def scan(self, carry, fixed, data, keys, start, indices, n=None):
        """Steps `start + indices` in a `lax.scan` from `carry`, `(params,
        opt_state)`: the carry reached and the losses. With `n`, the steps of
        indices past `n` are discarded (the end of the last block)."""

        def body(carry, i):
            p, s, value = self.step(carry[0], carry[1], fixed, data, keys, start + i)
            if n is not None:  # (a discarded step leaves nothing, its loss no NaN)
                pick = lambda new, old: jnp.where(i < n, new, old)
                p, s, value = jtu.tree_map(pick, (p, s, value), (*carry, 0.0))
            return (p, s), value

        return jax.lax.scan(body, carry, indices)


def _chunk(problem: _Problem, trees: Any, capacity: int, block: int) -> Callable:
    """The chunk as a function of flat arrays: `(params, opt_state, fixed,
    data, keys, start, n)` to `(params, opt_state, losses, finite)`, running
    steps `start .. start + n` (n <= capacity) and writing their losses to
    `losses[:n]`; `finite` is whether every parameter is finite at the end."""

    def fit_chunk(*flat):
        params, opt, fixed, data, keys, start, n = jtu.tree_unflatten(trees, flat)

        def blocks(carry):
            j, p, s, losses = carry
            steps = j * block + jnp.arange(block, dtype=jnp.int32)
            last = None if block == 1 else n
            (p, s), values = problem.scan((p, s), fixed, data, keys, start, steps, last)
            losses = jax.lax.dynamic_update_slice_in_dim(losses, values, j * block, 0)
            return j + 1, p, s, losses

        mesh = _sharding.first_mesh(jtu.tree_leaves((params, fixed, data)))
        losses = _sharding.zeros(capacity, jnp.result_type(float), mesh)
        carry = (jnp.int32(0), params, opt, losses)
        _, params, opt, losses = jax.lax.while_loop(
            lambda c: c[0] * block < n, blocks, carry
        )
        finite = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(params)]
        return jtu.tree_leaves((params, opt, losses, jnp.all(jnp.stack(finite))))

    return fit_chunk


def _positive(name: str, value: Any, most: int | None = None, of: str = "") -> int:
    """`value` checked to be an integer in `1 .. most` (`of`: `most` in words)."""
    message = f"fit: `{name}` must be a positive integer, got {value!r}."
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(message)
    if int(value) < 1:
        raise ValueError(message)
    if most is not None and int(value) > most:
        raise ValueError(f"fit: `{name}` ({value}) is more than {of}.")
    return int(value)


def _optimiser(optimiser: Any) -> optax.GradientTransformation:
    """`optimiser`, or the transformation of an `optax.MultiSteps`."""
    if isinstance(optimiser, optax.GradientTransformation):
        return optimiser
    if isinstance(optimiser, optax.MultiSteps):
        # (Its `update` passes `value=`, `grad=`, `value_fn=` on to the inner
        # optimiser; `gradient_transformation()`'s would be dropped.)
        update: Any = optimiser.update
        return optax.GradientTransformationExtraArgs(optimiser.init, update)
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


def _arguments(
    loss_fn, optimiser, steps, data, batch_size, key, progress, chunk_size, state
):
    """`fit`'s arguments checked, with messages that say how to fix them: the
    numbers of steps, the data (NumPy rows made JAX arrays, indexed by traced
    minibatch indices), the call's two keys and the problem, yet without the
    model."""
    steps = _positive("steps", steps)
    most = "1,000,000 (the default rarely needs changing: chunks are timed)"
    chunk_size = _positive("chunk_size", chunk_size, 1_000_000, most)
    optimiser = _optimiser(optimiser)
    if progress not in (True, False):
        raise TypeError(f"fit: `progress` must be True or False, got {progress!r}.")
    if state is not None and not isinstance(state, FitState):
        got = type(state).__name__
        raise TypeError(
            f"fit: `state` must be an `ep.FitState` (from a fit), got {got}."
        )
    if not callable(loss_fn):
        raise TypeError(f"fit: `loss_fn` must be callable, got {loss_fn!r}.")
    try:
        signature = inspect.signature(loss_fn)
    except (TypeError, ValueError):
        signature = None
    takes_key = signature is not None and "key" in signature.parameters
    rows = 0
    if data is not None:
        leaves = jtu.tree_leaves(data)
        sizes = {x.shape[0] if eqx.is_array(x) and x.ndim else 0 for x in leaves}
        if len(sizes) != 1 or 0 in sizes:
            shapes = [getattr(x, "shape", type(x).__name__) for x in leaves]
            need = "the same number of rows (leading axis, at least one)"
            raise ValueError(f"fit: `data` must be arrays with {need}, got {shapes}.")
        rows, data = sizes.pop(), jtu.tree_map(jnp.asarray, data)
        if batch_size is not None:
            of = f"the number of rows in `data` ({rows})"
            batch_size = _positive("batch_size", batch_size, rows, of)
    elif batch_size is not None:
        raise ValueError("fit: `batch_size` needs `data` (a PyTree of arrays, rows).")
    needs_key = batch_size is not None or takes_key
    if needs_key and key is None:
        why = "minibatches" if batch_size is not None else "a loss taking `key`"
        raise ValueError(f"fit: {why} need a PRNG key: pass `key=jax.random.key(0)`.")
    if key is not None and not needs_key:
        why = "used only for minibatches (`batch_size`) or a loss taking `key`"
        raise ValueError(f"fit: `key` is {why}; this call has neither. Drop `key`.")
    # The call's two keys, for its minibatches and for the loss, split eagerly
    # (compiled once a process), not in every chunk: 10 fewer kernels to
    # compile in `benchmarks/peers.py`'s VI row (`docs/performance.md`).
    try:
        keys = None if key is None else jax.random.split(key)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"fit: `key` must be one PRNG key, e.g. `jax.random.key(0)`, got "
            f"{key!r} (JAX: {e})"
        ) from None
    call = "loss_fn(model" + (", batch" if data is not None else "")
    call += ", key=key)" if takes_key else ")"
    try:  # (a `TypeError` raised inside the loss is the user's own: not here)
        if signature is not None:
            args = [None] * (1 + (data is not None))
            signature.bind(*args, **({"key": None} if takes_key else {}))
    except TypeError as e:
        raise TypeError(
            f"fit: `loss_fn` cannot be called as `{call}`: {e}. With `data`, the "
            "loss takes `(model, batch)`; without, `(model)`; add a `key` "
            "parameter for a fresh key per step."
        ) from None
    promotion = jax.config.jax_numpy_dtype_promotion  # pyright: ignore[reportAttributeAccessIssue]
    problem = _Problem(loss_fn, optimiser, batch_size, rows, takes_key, call, promotion)
    return steps, chunk_size, data, keys, problem


def _check_model(model: PyTree) -> None:
    """Raise for what would train wrongly or fail obscurely: a raw library
    object in the model (numpyro's objects are proper pytrees: they train), or
    constrained fields holding raw arrays."""
    for path, x in jtu.tree_flatten_with_path(model, is_leaf=is_raw)[0]:
        if is_raw(x) and getattr(family_of_instance(x), "name", None) != "numpyro":
            name, at = type(x).__name__, label_of(path)
            raise TypeError(
                f"fit: the model holds a raw {name} at `{at}`, whose arrays JAX cannot "
                f"differentiate. Wrap it: `ep.FixedDistrax({name}, ...)`."
            )
    labels = unparameterized(model)
    if labels:
        names = ", ".join(f"`{label}`" for label in labels[:5])
        more = f" (and {len(labels) - 5} more)" if len(labels) > 5 else ""
        raise ValueError(
            f"fit: `ep.field(constraint=...)` fields hold raw arrays ({names}{more}) "
            "that would train unconstrained (out of their support, frozen ones "
            "too). Call `model = ep.parameterize(model)` first, and "
            "`ep.resolve(model)` in the loss."
        )


def _trace_loss(problem: _Problem, params, fixed, data, keys) -> _Problem:
    """`problem` with its loss traced, the one trace of the user's loss in this
    call, checked: it must return a real scalar that reads a trainable
    parameter."""
    arrays = (params, fixed, data, keys, jax.ShapeDtypeStruct((), jnp.int32))
    try:
        closed, out = jax.make_jaxpr(problem.value, return_shape=True)(*arrays)
    except jax.dtypes.TypePromotionError as e:
        raise _mixed_floats(
            problem, {"model": (params, fixed), "data": data}, e
        ) from None
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"fit: `{problem.call}` must return a scalar array, got "
            f"{type(out).__name__} ({jtu.tree_structure(out)}). Return only the loss."
        )
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"fit: `{problem.call}` must return a real floating-point scalar, got "
            f"shape {out.shape} and dtype {out.dtype}. Reduce it (e.g. `jnp.sum`) "
            "and keep it real (`jnp.real`, `.astype(float)`)."
        )
    inputs = set(map(id, closed.jaxpr.invars[: len(jtu.tree_leaves(params))]))
    used = [*closed.jaxpr.outvars, *(v for e in closed.jaxpr.eqns for v in e.invars)]
    if not any(id(v) in inputs for v in used):
        raise ValueError(
            f"fit: `{problem.call}` does not depend on any trainable parameter of "
            "the model: training would change nothing. Use the model's arrays "
            "(Python floats are static; `ep.Frozen` values are not trained)."
        )
    avals = tuple(_aval(v.aval) for v in closed.jaxpr.invars)
    return dataclasses.replace(problem, traced=closed, avals=avals)


def _mixed_floats(problem: _Problem, trees: dict, error: Exception) -> Exception:
    """A strict promotion error of the loss, with the paths of the model's and
    the data's arrays of each float dtype when they hold more than one."""
    where: dict = {}
    for name, tree in trees.items():
        for path, x in jtu.tree_flatten_with_path(tree)[0]:
            if eqx.is_inexact_array(x):
                label = f"{name}{jtu.keystr(path[1:] if name == 'model' else path)}"
                where.setdefault(str(x.dtype), []).append(f"`{label}`")
    if len(where) < 2:
        return error
    listed = "; ".join(f"{d}: {', '.join(p[:3])}" for d, p in sorted(where.items()))
    return type(error)(
        f"fit: `{problem.call}` mixes float dtypes, which strict dtype promotion "
        f"refuses ({listed}). Cast the model and data to one dtype, e.g. "
        "`jax.tree.map(lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) "
        "else x, model)`, or call fit under `jax.numpy_dtype_promotion('standard')`."
        f" (JAX: {error})"
    )


def _resumed(state: FitState, fresh: PyTree) -> PyTree:
    """The optimiser state of `state`, checked against a fresh one (`fresh`)
    and, under a mesh with `Explicit` axes, placed as the fresh one is."""
    opt, treedef = jtu.tree_flatten(state.opt_state)
    like, like_treedef = jtu.tree_flatten(fresh)
    aval = lambda x: (jnp.shape(x), jnp.result_type(x))  # noqa: E731
    if treedef != like_treedef or list(map(aval, opt)) != list(map(aval, like)):
        raise ValueError(
            "fit: `state` does not match this model and optimiser (another structure, "
            "shape or dtype): pass `ep.FitState.init(model, optimiser)` or one a fit "
            "of this model and optimiser returned."
        )
    step = state.step
    if (
        jnp.shape(step) != ()
        or not jnp.issubdtype(jnp.result_type(step), jnp.integer)
        or (not isinstance(step, jax.core.Tracer) and not 0 <= int(step) < 2**31 - 1)
    ):
        raise ValueError(
            "fit: `state.step` must be an integer scalar step count, 0 <= step "
            f"< 2**31 - 1, got {step}."
        )
    return jtu.tree_unflatten(treedef, _sharding.place_like(opt, like))


@overload
def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
    *,
    optimiser: optax.GradientTransformation | optax.MultiSteps,
    steps: int,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool = True,
    chunk_size: int = 10_000,
    steps_per_block: int | None = None,
    state: FitState | None = None,
    return_state: Literal[False] = False,
) -> tuple[PyTree, Array]: ...


@overload
def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
    *,
    optimiser: optax.GradientTransformation | optax.MultiSteps,
    steps: int,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool = True,
    chunk_size: int = 10_000,
    steps_per_block: int | None = None,
    state: FitState | None = None,
    return_state: Literal[True],
) -> tuple[PyTree, Array, FitState]: ...


def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
    *,
    optimiser: optax.GradientTransformation | optax.MultiSteps,
    steps: int,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool = True,
    chunk_size: int = 10_000,
    steps_per_block: int | None = None,
    state: FitState | None = None,
    return_state: bool = False,
) -> tuple[PyTree, Array] | tuple[PyTree, Array, FitState]:
    """Minimise `loss_fn` over the trainable parameters of `model` with optax.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` holding `ep.Bijector`s
      (`ep.parameterize(model)`; resolve them inside `loss_fn` with `ep.resolve`).
      Only `ep.trainable` leaves train: a `Bijector`'s unconstrained `param` and
      plain float arrays, not `ep.Frozen` values or a transform's own arrays.
    - `loss_fn`: `loss_fn(model)`, or `loss_fn(model, batch)` with `data`; with a
      keyword parameter named `key`, each step also gets its own key,
      `jax.random.fold_in(k, step)`. It returns a real floating-point scalar.
    - `optimiser`: an optax `GradientTransformation` (`optax.adam(1e-2)`) or an
      `optax.MultiSteps`. Optimisers that need the loss (`optax.lbfgs`,
      `optax.contrib.reduce_on_plateau`) get `value=`, `grad=` and `value_fn=`.
    - `steps`: the number of optimisation steps.
    - `data`: optional PyTree of arrays sharing a leading (row) axis.
    - `batch_size`: rows per step, drawn uniformly with replacement; `None` uses
      all rows. With `data` sharded over the processes of `jax.distributed`,
      each step's rows are global indices drawn from all rows with the same key
      on every process (see [several hosts](../howto/multi_host.md)).
    - `key`: a PRNG key, for minibatches and for a loss taking `key`.
    - `progress`: show a tqdm bar with the loss (a notebook widget where
      ipywidgets is installed, else text on stderr).
    - `chunk_size`: the most steps per compiled call.
    - `steps_per_block`: the steps of each `lax.scan` inside a compiled call, a
      trip count fixed at compile time. `None`: 32 on an accelerator (GPU, TPU)
      for a call of at least 1,000 steps, else 1. The last block of a call may
      compute steps it then discards; a loss with host callbacks runs 1.
    - `state`: a `FitState` to continue from (`FitState.init` or one returned).
    - `return_state`: also return the `FitState` reached.

    **Returns:**

    `(trained_model, losses)`, `losses[i]` the loss at the start of step `i` (and
    the `FitState` with `return_state=True`). On `KeyboardInterrupt`, `fit` warns
    and returns the model and losses of the steps finished so far.

    **Raises:**

    `ep.NonFiniteLossError` at the first non-finite loss or gradient, with the
    last finite model; `TypeError`/`ValueError` naming the argument and the fix
    for a model with nothing to train, constrained fields holding raw arrays
    (call `ep.parameterize` first), a raw distrax/TFP/numpyro object in the
    model, a loss that returns no real scalar or reads no parameter, trainable
    parameters that are not finite at the start, a `state.step` plus `steps`
    past 2**31 - 1, and the like.

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

    **What compiles.** Every call traces the loss and optimiser as they are at
    that moment and lowers the chunk of steps; a compiled program is reused only
    when that lowering is identical, constants included (see
    [the fit guide](../howto/fit.md)).
    """
    steps, chunk_size, data, keys, problem = _arguments(
        loss_fn, optimiser, steps, data, batch_size, key, progress, chunk_size, state
    )
    if steps_per_block is not None:
        steps_per_block = _positive("steps_per_block", steps_per_block, 1024, "1024")
    _check_model(model)
    params, static = eqx.partition(model, trainable(model))
    if not jtu.tree_leaves(params):
        raise ValueError(
            "fit: the model has nothing to train: no float arrays outside "
            "`ep.Frozen` nodes. Python floats are static: pass `jnp.asarray(1.0)`."
        )
    fixed, skeleton = eqx.partition(static, eqx.is_array)
    params, fixed, data, keys = _sharding.place_together((params, fixed, data, keys))
    params = _strong(params)
    fresh = _init(problem.optimiser, params)
    opt, start = (fresh, 0) if state is None else (_resumed(state, fresh), state.step)
    if (
        not isinstance(start, jax.core.Tracer)
        and (first := int(start)) + steps >= 2**31
    ):
        raise ValueError(
            f"fit: `state.step` ({first}) plus `steps` ({steps}) is more than "
            "2**31 - 1, the most steps a fit counts (its batches and keys are "
            "drawn by int32 step number). Start afresh: `ep.FitState.init`."
        )
    problem = dataclasses.replace(problem, skeleton=skeleton)
    problem = _trace_loss(problem, params, fixed, data, keys)
    args = (params, opt, fixed, data, keys)
    out = None
    # Under a trace (`jax.jit`, `lax.scan`, ...) even an operation on concrete
    # values gives a tracer: the steps then belong in the caller's program.
    if not isinstance(jnp.zeros(()), jax.core.Tracer) and not any(
        isinstance(x, jax.core.Tracer) for x in jtu.tree_leaves((*args, start))
    ):
        block = _block(jtu.tree_leaves(args), steps, steps_per_block)
        with contextlib.suppress(_programs.Traced):  # (an outer `jax.vmap`'s value)
            out = _run(
                problem, model, static, args, start, steps, chunk_size, progress, block
            )
    if out is None:  # all steps in one `lax.scan` of the caller's program; nothing
        # reaches the host (no bar, no `NonFiniteLossError`: the losses keep them)
        indices = jnp.arange(steps, dtype=jnp.int32)
        carry = (params, opt)
        (params, opt), losses = problem.scan(carry, fixed, data, keys, start, indices)
        state = FitState(opt, jnp.int32(start + steps))
        out = eqx.combine(params, static), losses, state
    return out if return_state else out[:2]


def _check_finite(params: PyTree, step: int) -> None:
    """Raise, naming them, if trainable parameters are not finite before `step`
    (a fit could only stop at once: the fault is in the model given)."""
    leaves = jtu.tree_flatten_with_path(params)[0]
    bad = [label_of(k) for k, x in leaves if not jnp.all(jnp.isfinite(x))]
    if bad:
        raise ValueError(
            f"fit: the trainable parameter(s) {', '.join(bad)} of the model are not "
            f"finite before step {step}. Start them finite, or keep them out of "
            "training (`ep.field(trainable=False)`, or a static field)."
        )


def _run(problem, model, static, args, start, steps, chunk_size, progress, block):
    """`fit` on concrete values: the chunk compiled (`_programs`), then run
    chunk after chunk from the host, each timed to last about a quarter of a
    second: progress, Ctrl-C, and a chunk that went non-finite run again one
    step at a time, to find the first step whose loss, or whose updated
    parameters (how a non-finite gradient shows), is not finite. The losses are
    put where the steps ran (a chunk's losses buffer): replicated over its
    devices, committed only if it is. Raises `_programs.Traced` if the loss
    reads a value of an outer transformation."""
    start = int(start)
    flat, trees = jtu.tree_flatten((*args, np.int32(start), np.int32(0)))
    capacity = -(-chunk_size // block) * block
    chunk = _chunk(problem, trees, capacity, block)
    run, reusable = _programs.program(chunk, flat, _CHUNK_OPTIONS)
    if block > 1 and not reusable:  # host callbacks: no discarded steps
        block, capacity = 1, chunk_size
        chunk = _chunk(problem, trees, capacity, 1)
        run, _ = _programs.program(chunk, flat, _CHUNK_OPTIONS)
    state_tree = jtu.tree_structure(args[:2])
    n_state = state_tree.num_leaves
    try:  # (a widget in a notebook needs ipywidgets; without it, a text bar,
        # rather than `tqdm.auto`'s warning and then a text bar)
        import ipywidgets  # noqa: F401  # pyright: ignore[reportMissingImports]
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm

    processes = jax.process_count()  # (with `jax.distributed`, one per host)
    shown = progress and jax.process_index() == 0
    bar = tqdm(total=steps, unit="step", mininterval=0.25, disable=not shown)
    losses = [np.zeros((0,), jnp.result_type(float))]
    done, length, like, replay = 0, min(128, capacity), None, 0
    try:
        while done < steps:
            # (Steps before `replay`: a chunk that was not finite, one at a time.)
            n = 1 if done < replay else min(length, steps - done)
            began = time.perf_counter()
            flat[-2:] = [np.int32(start + done), np.int32(n)]
            out = run(*flat)
            chunk, finite = np.asarray(out[n_state])[:n], bool(out[n_state + 1])
            if not (finite and np.isfinite(chunk).all()):
                if n > 1:
                    replay = done + n
                    continue
                params, _ = jtu.tree_unflatten(state_tree, flat[:n_state])
                _check_finite(params, done)
                raise NonFiniteLossError(
                    f"fit: the loss or its gradient is not finite at step {done} "
                    f"(loss = {float(chunk[0])}); `error.model` holds the last finite "
                    "parameters. Lower the learning rate, or constrain the "
                    "parameters the loss takes a log or sqrt of (`ep.positive`).",
                    step=done,
                    model=eqx.combine(params, static),
                    losses=jnp.asarray(np.concatenate([*losses, chunk])),
                )
            flat[:n_state], like = out[:n_state], out[n_state]
            losses.append(chunk)
            done += n
            bar.set_postfix(loss=f"{float(chunk[-1]):.6g}", refresh=False)
            bar.update(n)
            seconds = max(time.perf_counter() - began, 1e-9)
            length = max(block, min(capacity, int(0.25 * n / seconds)))
            length -= length % block
            if processes > 1:  # every process runs the same chunks: process 0's
                length = int(multihost_utils.broadcast_one_to_all(np.int32(length)))
    except (KeyboardInterrupt, jax.errors.JaxRuntimeError) as e:
        # A Ctrl-C that lands inside a host callback reaches us wrapped by XLA.
        if not isinstance(e, KeyboardInterrupt) and "KeyboardInterrupt" not in str(e):
            if processes > 1:
                raise RuntimeError(
                    f"fit: process {jax.process_index()} of {processes} stopped after "
                    f"{done} of {steps} steps: another process failed (its own error "
                    "says why). Resume all from a checkpoint (`return_state=True`)."
                ) from e
            raise
        warnings.warn(
            f"fit: interrupted after {done} of {steps} steps; returning the model "
            "and losses reached so far.",
            stacklevel=3,  # (the caller of `fit`)
        )
    finally:
        bar.close()
    params, opt = jtu.tree_unflatten(state_tree, flat[:n_state])
    where = like.sharding if like is not None and like.committed else None
    history = jax.device_put(np.concatenate(losses), where)
    result = model if done == 0 else eqx.combine(params, static)
    return result, history, FitState(opt, jnp.int32(start + done))
