"""`fit`: minimise a loss over a model's trainable parameters with optax.

Its one idea: a training loop that trains what the code says now. Each call
traces the user's loss once and runs pure steps (one optimiser update, its
batch and key from the global step number) in compiled chunks, each a
`lax.scan` of a length fixed when it compiles: the steps as written, and once a
chunk whether every loss and the parameters are finite. A chunk that is not
runs again from its start, checked: its carry keeps the first step that is not
finite and the parameters before it (a check in every step of every chunk cost
the VI step 5 more kernels on a GPU, `docs/performance.md`). `_programs` reuses
a compiled chunk only for an identical lowering. Between chunks `fit` shows
progress and stops on Ctrl-C. Under a JAX transformation the steps are one
`lax.scan` in the caller's program instead. `_fit_checks` checks the arguments,
the model and the loss's trace first, and builds the errors.

The chunks of a call: two steps, two more (whose time sets the length `L` of
the chunks that follow: the largest power of two of at most a second,
remembered with the program of two steps), chunks of `L`, then the rest. A call
with a new `steps` therefore compiles at most one new program, the rest. No
chunk holds one step (a fit of one step aside): XLA compiles a loop of one step
without its loop, which can round differently, so a resumed fit would not be
one long fit bit for bit.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import warnings
from collections.abc import Callable
from typing import Any

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

from . import _fit_checks as checks, _programs, _sharding
from ._parameter import trainable


# The most work a chunk of `L` steps holds, as timed: with half a second, the
# VI row of `benchmarks/fit_loop.py --small` measured 1.044 per step, with a
# second 1.015 (one run each; round trips to the host, `docs/performance.md`).
_SECONDS = 1.0


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
        return cls(_init(checks.optimiser_of(optimiser), _strong(params)), jnp.int32(0))


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


@dataclasses.dataclass(frozen=True)
class _Problem:
    """What a step reads besides the arrays: the loss, the optimiser, the
    model's non-array part, and how batches and keys reach the loss."""

    loss: Callable
    optimiser: optax.GradientTransformation
    batch_size: int | None
    rows: int  # (0 without data)
    takes_key: bool
    promotion: str  # the dtype promotion in force where `fit` was called
    skeleton: PyTree = None
    # The loss's one trace in this call (`checks.loss_trace`): a closed jaxpr
    # of `loss_of`'s arrays, which the steps evaluate rather than the user's
    # code, which could read other state if traced again (a random draw, say).
    traced: Any = None

    def loss_of(self, params, fixed, data, keys, step):
        """The user's loss of global step `step`, its batch and key drawn."""
        args: list[Any] = [eqx.combine(params, fixed, self.skeleton)]
        if self.batch_size is not None:
            index = jax.random.fold_in(keys[0], step)
            index = jax.random.randint(index, (self.batch_size,), 0, self.rows)
            data = jtu.tree_map(lambda d: _sharding.rows(d, index), data)
        args += [] if data is None else [data]
        kwargs = {"key": jax.random.fold_in(keys[1], step)} if self.takes_key else {}
        with jax.numpy_dtype_promotion(self.promotion):
            return self.loss(*args, **kwargs)

    def step(self, params, opt_state, fixed, data, keys, step):
        """One update: `(params, opt_state, loss)` after global step `step`."""

        def loss(p):  # (the one trace, in its dtypes: a line search's trial
            # parameters come promoted by `params + stepsize * updates`)
            xs = jtu.tree_leaves((p, fixed, data, keys, step))
            cast = zip(xs, self.traced.in_avals)
            xs = [x if x.dtype == a.dtype else x.astype(a.dtype) for x, a in cast]
            return jex.jaxpr_as_fun(self.traced)(*xs)[0]

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

    def scan(self, params, opt, fixed, data, keys, start, length, check=False):
        """Steps `start .. start + length` in a `lax.scan`: the parameters, the
        optimiser state, the losses and `bad`. Unchecked, the steps run as
        written, and `bad` is -1 if every loss and the final parameters are
        finite, else `length`. Checked, each step also asks whether its loss and
        updated parameters are finite, the parameters stop before the first
        that is not, and `bad` is its index (-1 if none); then a fifth output
        says which parameter leaves that step's update left finite."""

        def body(carry, i):
            p, s, bad, *which = carry
            new, s, value = self.step(p, s, fixed, data, keys, start + i)
            if check:
                leaves = jtu.tree_leaves(new)
                finite = jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])
                ok = jnp.isfinite(value) & jnp.all(finite) & (bad < 0)
                which = [jnp.where(~ok & (bad < 0), finite, which[0])]
                new = jtu.tree_map(lambda a, b: jnp.where(ok, a, b), new, p)
                bad = jnp.where(ok | (bad >= 0), bad, i)
            return (new, s, bad, *which), value

        indices = jnp.arange(length, dtype=jnp.int32)
        # (checked, the carry also says which leaves the bad step left finite)
        which = [jnp.ones(len(jtu.tree_leaves(params)), bool)] if check else []
        (params, opt, bad, *which), losses = jax.lax.scan(
            body, (params, opt, -1, *which), indices
        )
        if not check:  # (once a chunk: whether to run it again, checked)
            leaves = [losses, *jtu.tree_leaves(params)]
            finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
            bad = jnp.where(finite, -1, length)
        return params, opt, losses, bad, *which


def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
    *,
    optimiser: optax.GradientTransformation | optax.MultiSteps | None = None,
    steps: int | None = None,
    data: PyTree | None = None,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    progress: bool = True,
    chunk_size: int = 10_000,
    state: FitState | None = None,
    return_state: bool = False,
    **unknown: Any,
) -> tuple[Any, ...]:
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
      `optax.contrib.reduce_on_plateau`) get `value=`, `grad=` and `value_fn=`
      (the loss as traced, in the parameters' dtypes).
    - `steps`: the number of optimisation steps.
    - `data`: optional PyTree of arrays sharing a leading (row) axis.
    - `batch_size`: rows per step, drawn uniformly with replacement; `None` uses
      all rows. With `data` sharded over the processes of `jax.distributed`,
      each step's rows are global indices drawn from all rows with the same key
      on every process (see [several hosts](../howto/multi_host.md)).
    - `key`: a PRNG key, for minibatches and for a loss taking `key`.
    - `progress`: show a tqdm bar with the loss (a notebook widget where
      ipywidgets is installed, else text on stderr), which says `compiling`
      while a chunk compiles and `training` while steps run.
    - `chunk_size`: the most steps of one compiled chunk, between two progress
      updates (chunks hold at most about a second of steps, as timed).
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
    model, 64-bit arrays with `jax_enable_x64` off, a loss that returns no real
    scalar or reads no parameter, trainable parameters that are not finite at
    the start, a `state.step` plus `steps` past 2**31 - 1, an unknown keyword
    (`optimizer=` asks for `optimiser=`), and the like.

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
    that moment; a compiled chunk is reused only when its lowering is identical
    (arrays the loss closes over are its inputs, not part of it; see
    [the fit guide](../howto/fit.md)).
    """
    known = [*inspect.signature(fit).parameters][2:-1]
    steps, optimiser, data, batch_size, rows, keys, takes_key, call = checks.arguments(
        known, loss_fn, optimiser, steps, data, batch_size, key, progress, unknown
    )
    most = "1,000,000 (the default rarely needs changing: chunks are timed)"
    chunk_size = checks.positive("chunk_size", chunk_size, 1_000_000, most)
    checks.check_model(model)
    params, static = eqx.partition(model, trainable(model))
    if not jtu.tree_leaves(params):
        raise ValueError(
            "fit: the model has nothing to train: no float arrays outside "
            "`ep.Frozen` nodes. Python floats are static: pass `jnp.asarray(1.0)`."
        )
    fixed, skeleton = eqx.partition(static, eqx.is_array)
    params, fixed, data, keys = _sharding.place_together((params, fixed, data, keys))
    params = _strong(params)
    opt, start = _init(optimiser, params), 0
    if state is not None:
        if not isinstance(state, FitState):
            got = type(state).__name__
            raise TypeError(f"fit: `state` must be an `ep.FitState`, got {got}.")
        checks.resumed(state.opt_state, state.step, opt, steps)
        opt, start = state.opt_state, state.step
    promotion = jax.config.jax_numpy_dtype_promotion  # pyright: ignore[reportAttributeAccessIssue]
    problem = _Problem(
        loss_fn, optimiser, batch_size, rows, takes_key, promotion, skeleton
    )
    traced = checks.loss_trace(problem.loss_of, call, params, fixed, data, keys)
    problem = dataclasses.replace(problem, traced=traced)
    args = (params, opt, fixed, data, keys)
    # Under a trace (`jax.jit`, `lax.scan`, ...) even an operation on concrete
    # values gives a tracer: the steps then belong in the caller's program.
    if not isinstance(jnp.zeros(()), jax.core.Tracer) and not any(
        isinstance(x, jax.core.Tracer) for x in jtu.tree_leaves((*args, start))
    ):
        try:
            out = _run(
                problem, model, static, args, int(start), steps, chunk_size, progress
            )
            return out if return_state else out[:2]
        except _programs.Traced:  # (an outer `jax.vmap`'s value)
            pass
    # All steps in one `lax.scan` of the caller's program; nothing reaches the
    # host (no bar, no `NonFiniteLossError`: the losses keep them).
    params, opt, losses, *_ = problem.scan(*args, start, steps)
    out = eqx.combine(params, static), losses, FitState(opt, jnp.int32(start + steps))
    return out if return_state else out[:2]


def _length(seconds: float, most: int) -> int:
    """The chunk length for steps of `seconds`: the largest power of two whose
    steps take at most `_SECONDS` (at least 2), at most `most`, agreed by every
    process."""
    length = min(most, 2 ** max(1, int(np.log2(_SECONDS / max(seconds, 1e-9)))))
    if jax.process_count() > 1:  # (every process runs the same chunks: process 0's)
        length = int(multihost_utils.broadcast_one_to_all(np.int32(length)))
    return length


def _run(problem, model, static, args, start, steps, chunk_size, progress):
    """`fit` on concrete values: chunks compiled (`_programs`) and run from the
    host, with progress between them, and a chunk that is not finite again,
    checked. The losses are put where the steps ran, committed only if they
    are. Raises `_programs.Traced` if the loss reads a value of an outer
    transformation."""
    flat, trees = jtu.tree_flatten((*args, np.int32(start)))
    state_tree = jtu.tree_structure(args[:2])
    programs: dict[tuple, Any] = {}

    def run(n: int, check: bool = False) -> tuple[list, Array, int, dict]:
        # (A chunk's outputs can come back sharded otherwise than its inputs went
        # in, over a mesh the loss names: the next chunk then needs its program.)
        key = (n, check, *map(_spread, flat))
        if key not in programs:
            bar.set_description_str("compiling", refresh=shown)

            def fit_chunk(*xs: Any, length: int = n) -> list:
                out = problem.scan(*jtu.tree_unflatten(trees, xs), length, check)
                return jtu.tree_leaves(out)

            programs[key] = _programs.program(fit_chunk, flat)
            bar.set_description_str("training", refresh=False)
        compiled, notes = programs[key]
        outputs = list(compiled(*flat))
        if check:  # (which parameters the bad step's update left finite)
            notes = {**notes, "finite": np.asarray(outputs.pop())}
        *state, values, bad = outputs
        return state, values, int(bad), notes  # (`int` waits for the chunk)

    try:  # (a widget in a notebook needs ipywidgets; without it, a text bar,
        # rather than `tqdm.auto`'s warning and then a text bar)
        import ipywidgets  # noqa: F401  # pyright: ignore[reportMissingImports]
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm import tqdm

    shown = progress and jax.process_index() == 0  # (one bar for all processes)
    bar = tqdm(total=steps, unit="step", mininterval=0.25, disable=not shown)
    losses, done, length, where = [], 0, 1, None
    try:
        while done < steps:
            n = min(2 if done < 4 else length, chunk_size, steps - done)
            n += steps - done - n == 1 and n < chunk_size  # (no chunk of one step)
            flat[-1] = np.int32(start + done)
            began = time.perf_counter()
            state, values, bad, notes = run(n)
            if done == 2:  # (the first program remembers the length chosen)
                seconds = (time.perf_counter() - began) / n
                length = notes.setdefault("length", _length(seconds, chunk_size))
            finite = None
            if bad == n:  # (not finite somewhere: the chunk again, each step checked)
                state, values, bad, checked = run(n, check=True)
                finite = checked["finite"]
            host = np.asarray(values)
            where = values.sharding if values.committed else None
            if bad >= 0:
                losses.append(host[: bad + 1])
                params = jtu.tree_unflatten(state_tree, state)[0]
                seen = np.concatenate(losses)
                raise checks.non_finite(params, static, done + bad, seen, finite)
            flat[: len(state)] = state
            losses.append(host)
            done += n
            bar.set_postfix(loss=f"{host[-1]:.6g}", refresh=False)
            bar.update(n)
    except (KeyboardInterrupt, jax.errors.JaxRuntimeError) as e:
        # A Ctrl-C that lands inside a host callback reaches us wrapped by XLA.
        if not isinstance(e, KeyboardInterrupt) and "KeyboardInterrupt" not in str(e):
            if jax.process_count() > 1:
                raise RuntimeError(
                    f"fit: process {jax.process_index()} stopped after {done} of "
                    f"{steps} steps: another process failed (its own error says why). "
                    "Resume all from a checkpoint (`return_state=True`)."
                ) from e
            raise
        warnings.warn(
            f"fit: interrupted after {done} of {steps} steps; returning the model "
            "and losses reached so far.",
            stacklevel=3,  # (the caller of `fit`)
        )
    finally:
        bar.close()
    params, opt = jtu.tree_unflatten(state_tree, flat[: state_tree.num_leaves])
    result = model if done == 0 else eqx.combine(params, static)
    return result, _gather(losses, where), FitState(opt, jnp.int32(start + done))


def _spread(x: Any) -> Any:
    """`x`'s sharding if it is committed to several devices, else 0."""
    return x.sharding if getattr(x, "committed", 0) and len(x.devices()) > 1 else 0


def _gather(losses: list, where: Any) -> Array:
    """The chunks' losses (NumPy) in one array, placed at `where`."""
    values = np.concatenate(losses) if losses else np.zeros(0, jnp.result_type(float))
    return jax.device_put(values, where)
