"""What `fit` refuses, each with a message that names the argument or leaf and
the fix: its arguments (an unknown keyword asks "did you mean"), the model (raw
library objects, 64-bit arrays with `jax_enable_x64` off, constrained fields
holding raw arrays), the loss as traced, a `FitState` to resume from, and a
non-finite step (`NonFiniteLossError`). `_fit` runs the steps.
"""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, PyTree

from ._families import family_of_instance, is_raw
from ._metadata import label_of, unparameterized


# Keywords that other libraries spell differently, and what `fit` takes.
_ALIASES = {
    "optimizer": "`optimiser=` (British spelling)",
    "opt": "`optimiser=`",
    "lr": "`optimiser=optax.adam(lr)` (the learning rate is the optimiser's)",
    "learning_rate": "`optimiser=optax.adam(learning_rate)`",
    "num_iters": "`steps=`",
    "steps_per_block": "nothing: chunks are `lax.scan`s of a length set by timing",
}


# The dtypes that `jax_enable_x64` off would narrow.
_WIDE = tuple(map(np.dtype, (np.float64, np.int64, np.uint64, np.complex128)))


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
        self.step, self.model, self.losses = step, model, losses


class Arguments(NamedTuple):
    """`fit`'s arguments checked: data made JAX arrays (`rows` of them, 0
    without), the call's two keys (minibatches, the loss), whether the loss
    takes `key`, and how `fit` calls it, for messages."""

    steps: int
    optimiser: optax.GradientTransformation
    data: PyTree
    batch_size: int | None
    rows: int
    keys: Any
    takes_key: bool
    call: str


def positive(name: str, value: Any, most: int = 2**31 - 1, of: str = "") -> int:
    """`value` checked to be an integer in `1 .. most` (`of`: `most` in words)."""
    message = f"fit: `{name}` must be a positive integer, got {value!r}."
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(message)
    if int(value) < 1:
        raise ValueError(message)
    if int(value) > most:
        raise ValueError(f"fit: `{name}` ({value}) is more than {of}.")
    return int(value)


def optimiser_of(optimiser: Any) -> optax.GradientTransformation:
    """`optimiser`, or the transformation of an `optax.MultiSteps` (whose
    `update` passes `value=`, `grad=`, `value_fn=` on, where the transformation
    it makes with `gradient_transformation()` drops them)."""
    if isinstance(optimiser, optax.MultiSteps):
        update: Any = optimiser.update
        return optax.GradientTransformationExtraArgs(optimiser.init, update)
    if isinstance(optimiser, optax.GradientTransformation):
        return optimiser
    name = getattr(optimiser, "__name__", type(optimiser).__name__)
    if callable(optimiser) and not hasattr(optimiser, "update"):
        raise TypeError(
            f"fit: `optimiser` is the function `{name}` itself; call it to build "
            f"the optimiser, e.g. `optimiser=optax.{name}(1e-2)`."
        )
    raise TypeError(
        f"fit: `optimiser` must be an optax `GradientTransformation` "
        f"(e.g. `optax.adam(1e-2)`), got {name}."
    )


def arguments(
    known, loss_fn, optimiser, steps, data, batch_size, key, progress, unknown
) -> Arguments:
    """`fit`'s arguments but the model checked (`known`: its keyword names), with
    messages that say how to fix them."""
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        fix = _ALIASES.get(name) or (close and f"`{close[0]}=`")
        hint = f"did you mean {fix}?" if fix else f"it takes {', '.join(known)}."
        raise TypeError(f"fit: unexpected keyword argument `{name}`; {hint}")
    if optimiser is None:
        raise TypeError("fit: `optimiser=` is required, e.g. `optax.adam(1e-2)`.")
    steps, optimiser = positive("steps", steps), optimiser_of(optimiser)
    if progress not in (True, False):
        raise TypeError(f"fit: `progress` must be True or False, got {progress!r}.")
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
        if data is None:
            raise ValueError("fit: `batch_size` needs `data` (a PyTree of arrays).")
        of = f"the number of rows in `data` ({rows})"
        batch_size = positive("batch_size", batch_size, rows, of)
    if key is None and (batch_size is not None or takes_key):
        why = "minibatches need" if batch_size else "a loss taking `key` needs"
        raise ValueError(f"fit: {why} a PRNG key: pass `key=jax.random.key(0)`.")
    if key is not None and batch_size is None and not takes_key:
        why = "used only for minibatches (`batch_size`) or a loss taking `key`"
        raise ValueError(f"fit: `key` is {why}; this call has neither. Drop `key`.")
    # The call's two keys, for its minibatches and for the loss, split eagerly
    # (compiled once a process), not in every chunk: 10 fewer kernels to
    # compile in `benchmarks/peers.py`'s VI row (`docs/performance.md`).
    try:
        keys = None if key is None else jax.random.split(key)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"fit: `key` must be one PRNG key, e.g. `jax.random.key(0)`, "
            f"got {key!r} (JAX: {e})"
        ) from None
    call = "loss_fn(model" + ", batch" * (data is not None) + ", key=key" * takes_key
    try:  # (a `TypeError` raised inside the loss is the user's own: not here)
        if signature is not None:
            keyword = {"key": None} if takes_key else {}
            signature.bind(*[None] * (1 + (data is not None)), **keyword)
    except TypeError as e:
        raise TypeError(
            f"fit: `loss_fn` cannot be called as `{call})`: {e}. With `data`, the "
            "loss takes `(model, batch)`; without, `(model)`; add a `key` "
            "parameter for a fresh key per step."
        ) from None
    return Arguments(
        steps, optimiser, data, batch_size, rows, keys, takes_key, call + ")"
    )


def check_model(model: PyTree) -> None:
    """Raise for what would train wrongly or fail obscurely: a raw library
    object in the model (numpyro's objects are proper pytrees: they train),
    64-bit arrays while `jax_enable_x64` is off (the steps' carry would change
    type), constrained fields holding raw arrays."""
    leaves = jtu.tree_flatten_with_path(model, is_leaf=is_raw)[0]
    for path, x in leaves:
        if is_raw(x) and getattr(family_of_instance(x), "name", None) != "numpyro":
            name, at = type(x).__name__, label_of(path)
            raise TypeError(
                f"fit: the model holds a raw {name} at `{at}`, whose arrays JAX cannot "
                f"differentiate. Wrap it: `ep.FixedDistrax({name}, ...)`."
            )
    wide = [
        f"`{label_of(path)}` ({x.dtype})"
        for path, x in leaves
        if eqx.is_array(x) and x.dtype in _WIDE  # (a key's dtype is none of these)
    ]
    if wide and not jax.config.jax_enable_x64:  # pyright: ignore[reportAttributeAccessIssue]
        raise TypeError(
            f"fit: the model holds 64-bit arrays ({', '.join(wide[:5])}), but "
            "`jax_enable_x64` is off, so its steps would compute in 32 bits. Fit "
            "under `with jax.enable_x64(True):`, or cast the model: `jax.tree.map("
            "lambda x: x.astype(jnp.float32) if eqx.is_inexact_array(x) else x, "
            "model)`."
        )
    if labels := unparameterized(model):
        names = ", ".join(f"`{label}`" for label in labels[:5])
        more = f" (and {len(labels) - 5} more)" if len(labels) > 5 else ""
        raise ValueError(
            f"fit: `ep.field(constraint=...)` fields hold raw arrays ({names}{more}) "
            "that would train unconstrained (out of their support, frozen ones "
            "too). Call `model = ep.parameterize(model)` first, and "
            "`ep.resolve(model)` in the loss."
        )


def loss_trace(loss_of: Callable, call: str, params, fixed, data, keys) -> Any:
    """The closed jaxpr of `loss_of(params, fixed, data, keys, step)`, the one
    trace of the user's loss in a call (`call`: how `fit` calls it), checked: it
    returns a real scalar that reads a trainable parameter."""
    arrays = (params, fixed, data, keys, jax.ShapeDtypeStruct((), jnp.int32))
    try:
        closed, out = jax.make_jaxpr(loss_of, return_shape=True)(*arrays)
    except jax.dtypes.TypePromotionError as e:  # (strict promotion: say where)
        where: dict[str, list[str]] = {}
        for name, tree in (("model", (params, fixed)), ("data", data)):
            for k, x in jtu.tree_flatten_with_path(tree)[0]:
                if eqx.is_inexact_array(x):  # (the model's paths: no partition index)
                    label = f"`{name}{jtu.keystr(k[name == 'model' :])}`"
                    where.setdefault(str(x.dtype), []).append(label)
        if len(where) < 2:
            raise
        listed = "; ".join(f"{d}: {', '.join(p[:3])}" for d, p in sorted(where.items()))
        raise type(e)(
            f"fit: `{call}` mixes float dtypes, which strict dtype promotion "
            f"refuses ({listed}). Cast the model and data to one dtype, e.g. `jax."
            "tree.map(lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) "
            "else x, model)`, or call fit under `jax.numpy_dtype_promotion("
            f"'standard')`. (JAX: {e})"
        ) from None
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(
            f"fit: `{call}` must return a scalar array, got "
            f"{type(out).__name__} ({jtu.tree_structure(out)}). Return only the loss."
        )
    if out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"fit: `{call}` must return a real floating-point scalar, got "
            f"shape {out.shape} and dtype {out.dtype}. Reduce it (e.g. `jnp.sum`) "
            "and keep it real (`jnp.real`, `.astype(float)`)."
        )
    inputs = set(map(id, closed.jaxpr.invars[: len(jtu.tree_leaves(params))]))
    used = [*closed.jaxpr.outvars, *(v for e in closed.jaxpr.eqns for v in e.invars)]
    if not any(id(v) in inputs for v in used):
        raise ValueError(
            f"fit: `{call}` does not depend on any trainable parameter of "
            "the model: training would change nothing. Use the model's arrays "
            "(Python floats are static; `ep.Frozen` values are not trained)."
        )
    return closed


def resumed(opt_state: PyTree, step: Any, fresh: PyTree, steps: int) -> None:
    """Raise unless a `FitState`'s optimiser state and step fit a fresh
    optimiser state (`fresh`) and the call's `steps`."""

    def types(tree: PyTree) -> tuple:
        leaves, treedef = jtu.tree_flatten(tree)
        return treedef, [(jnp.shape(x), jnp.result_type(x)) for x in leaves]

    if types(opt_state) != types(fresh):
        raise ValueError(
            "fit: `state` does not match this model and optimiser (another structure, "
            "shape or dtype): pass `ep.FitState.init(model, optimiser)` or one a fit "
            "of this model and optimiser returned."
        )
    concrete = not isinstance(step, jax.core.Tracer)
    integer = jnp.shape(step) == () and jnp.issubdtype(
        jnp.result_type(step), jnp.integer
    )
    if not integer or (concrete and not 0 <= int(step) < 2**31 - steps):
        raise ValueError(
            "fit: `state.step` must be an integer step count, 0 <= step, and "
            f"`state.step` plus `steps` ({steps}) at most 2**31 - 1, the most steps "
            f"a fit counts (batches and keys are drawn by int32 step number), got "
            f"{step}. Start afresh: `ep.FitState.init`."
        )


def non_finite(params, static, step, losses, finite=None) -> Exception:
    """The error of a fit that stopped at `step`, with the parameters before it:
    a `ValueError` naming the parameters if they are not finite (so from the
    start), else a `NonFiniteLossError`, naming the parameters that step's
    update left not finite (`finite`: a flag per leaf of `params`)."""
    paths = jtu.tree_flatten_with_path(params)[0]
    if bad := [label_of(k) for k, x in paths if not jnp.all(jnp.isfinite(x))]:
        return ValueError(
            f"fit: the trainable parameter(s) {', '.join(bad)} of the model are not "
            f"finite before step {step}. Start them finite, or keep them out of "
            "training (`ep.field(trainable=False)`, or a static field)."
        )
    loss = losses[-1]
    what = f"the loss or its gradient is not finite at step {step} (loss = {loss})"
    if finite is not None and not finite.all() and np.isfinite(loss):
        names = [label_of(k) for (k, _), ok in zip(paths, finite) if not ok]
        shown = ", ".join(f"`{name}`" for name in names[:5])
        more = f" (and {len(names) - 5} more)" if len(names) > 5 else ""
        what = (
            f"the update is not finite at step {step} (loss = {loss}): it leaves "
            f"{shown}{more} not finite"
        )
    return NonFiniteLossError(
        f"fit: {what}; `error.model` holds the last finite parameters. Lower the "
        "learning rate, or constrain the parameters the loss takes a log or sqrt "
        "of (`ep.positive`).",
        step=step,
        model=eqx.combine(params, static),
        losses=jnp.asarray(losses),  # (NaN among them: no multi-process put)
    )
