"""`UpdateOnEvent`: run a stateful Equinox module only when an event fires.

All state of an Equinox module lives in `eqx.nn.State`, keyed by `StateIndex`es at
any depth; `state.substate(module)` captures every one of them, so a wrapper can
freeze them all with `lax.cond` and public API only.
"""

from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, PyTree


_PREFIX = "UpdateOnEvent: "
_INFER = "calling the wrapped module on example_input to infer its output shape"
BoolScalarLike = Bool[ArrayLike, ""]


def _call(module: Any, x: Any, state: eqx.nn.State) -> tuple[Any, eqx.nn.State]:
    # An `UpdateOnEvent` inside an `UpdateOnEvent` takes `x = (inner_event, inner_x)`.
    if isinstance(module, UpdateOnEvent):
        if not (isinstance(x, tuple) and len(x) == 2):
            raise TypeError(
                f"{_PREFIX}the wrapped module is itself an `UpdateOnEvent`, so its "
                "input is the pair `x = (inner_event, inner_x)` (build the outer one "
                f"with `example_input=(True, inner_x)`); got a {type(x).__name__}."
            )
        return module(*x, state)
    return module(x, state)


def _describe(leaves: list) -> str:
    return ", ".join(f"{jnp.result_type(a).name}{list(jnp.shape(a))}" for a in leaves)


def _fill(value: ArrayLike, struct: jax.ShapeDtypeStruct) -> Array:
    """Cast `value` to `struct`'s dtype (losslessly) and broadcast it to its shape."""
    if not isinstance(value, jax.core.Tracer):
        # Check on the host, in NumPy's own (64-bit) dtypes: `jnp.asarray(2**40)`
        # would wrap around and `jnp.asarray(1e40)` become inf in float32 first.
        v = np.asarray(value)
        if not (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_):
            raise TypeError(
                f"{_PREFIX}`initial_output` must be a number or an array, got "
                f"{type(value).__name__}."
            )
        with np.errstate(all="ignore"):
            cast = v.astype(np.dtype(struct.dtype))
            if np.issubdtype(cast.dtype, np.floating):  # rounding is fine, overflow not
                same = np.array_equal(np.isfinite(cast), np.isfinite(v))
            else:
                same = np.array_equal(cast.astype(v.dtype), v, equal_nan=True)
        if not same:
            nan = np.issubdtype(v.dtype, np.floating) and np.isnan(v).any()
            hint = " (`nan` is the default, and is only possible for floating outputs)"
            raise ValueError(
                f"{_PREFIX}`initial_output` = {v} cannot be represented in the dtype "
                f"{jnp.dtype(struct.dtype).name} of the wrapped module's output"
                f"{hint if nan else ''}. Pass a value that can, e.g. "
                f"`initial_output={'False' if cast.dtype == np.bool_ else '-1'}`."
            )
        value = cast
    value = jnp.asarray(value)
    try:
        return jnp.broadcast_to(value.astype(struct.dtype), struct.shape)
    except ValueError:
        raise ValueError(
            f"{_PREFIX}`initial_output` has shape {value.shape}, not broadcastable to "
            f"the output shape {struct.shape}. Pass a scalar or an array of that shape."
        ) from None


def _check_event(event: Any) -> bool | BoolScalarLike:
    if isinstance(event, (bool, np.bool_)):
        return bool(event)
    dtype = getattr(event, "dtype", None)
    if dtype is None or jnp.dtype(dtype) != jnp.bool_:
        got = f"dtype {dtype}" if dtype is not None else f"type {type(event).__name__}"
        raise TypeError(
            f"{_PREFIX}`event` must be a Python bool or a boolean JAX array of shape "
            f"(), but got {got}. Convert it, e.g. `count > 0` or `event.astype(bool)`."
        )
    if jnp.shape(event) != ():
        raise ValueError(
            f"{_PREFIX}`event` must be a scalar (shape ()), but got shape "
            f"{jnp.shape(event)}. For a batch, `jax.vmap` the events, inputs and state."
        )
    return event


class UpdateOnEvent(eqx.Module):
    """Run a stateful module only when an event fires; otherwise freeze it.

    On steps where `event` is true the wrapped module is called and both its output
    and **all** of its state (every `eqx.nn.StateIndex`, at any depth) move on. On
    steps where `event` is false the previous output is returned and the state is
    left exactly as it was. The previous output is itself stored in the state, so
    the wrapper is pure and works under `jax.jit`, `jax.lax.scan` and `jax.vmap`.

    A traced scalar `event` uses `jax.lax.cond`, so the module's computation is
    skipped when the event is false. (Under `jax.vmap` over a batch of events, JAX
    turns this into a `select` and computes both branches.) A Python `bool` is
    resolved at trace time.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Counter(eqx.Module):
        index: eqx.nn.StateIndex

        def __init__(self):
            self.index = eqx.nn.StateIndex(jnp.zeros(()))

        def __call__(self, x, state):
            total = state.get(self.index) + x
            return 2 * total, state.set(self.index, total)

    x = jnp.ones(())
    model, state = eqx.nn.make_with_state(ep.UpdateOnEvent)(Counter(), x)
    out, state = model(False, x, state)  # nan: nothing has happened yet
    out, state = model(True, x, state)   # 2.0
    out, state = model(False, x, state)  # 2.0 again; the counter is frozen
    assert out == 2.0
    ```
    """

    module: Any
    output_index: eqx.nn.StateIndex

    def __init__(
        self, module: Any, example_input: PyTree, initial_output: PyTree = jnp.nan
    ):
        """**Arguments:**

        - `module`: a module called as `module(x, state) -> (output, state)`, built
            directly (e.g. `MyModule()`), *not* through `eqx.nn.make_with_state`:
            instead wrap the result, `eqx.nn.make_with_state(UpdateOnEvent)(module,
            x)`. If `module` is itself an `UpdateOnEvent`, its input is the pair
            `x = (inner_event, inner_x)`.
        - `example_input`: an input of the shape and dtype the module will be called
            with. Only its shape and dtype are used, to infer the output's.
        - `initial_output`: the output returned before the first event. Either a
            single value, broadcast to every array of the output, or a PyTree of the
            output's structure. Defaults to `nan`; integer or boolean outputs need
            an explicit value.
        """
        try:
            inner_state = eqx.nn.State(module)
        except ValueError as e:
            raise ValueError(
                f"{_PREFIX}could not build the wrapped module's state ({e}). Pass the "
                "module as constructed, not the result of `eqx.nn.make_with_state`, "
                "and wrap it: `eqx.nn.make_with_state(UpdateOnEvent)(module, x)`."
            ) from e
        try:
            struct = eqx.filter_eval_shape(
                lambda m, x, s: _call(m, x, s)[0], module, example_input, inner_state
            )
        except Exception as e:
            message = f"{_PREFIX}{_INFER} failed: {e}"
            try:
                error = type(e)(message)
            except Exception:
                error = ValueError(message)
            raise error from e
        leaves, treedef = jtu.tree_flatten(struct)
        bad = [x for x in leaves if not isinstance(x, jax.ShapeDtypeStruct)]
        if bad:
            raise TypeError(
                f"{_PREFIX}the wrapped module must return a PyTree of JAX arrays, but "
                f"it returned a {type(bad[0]).__name__}. Wrap it in `jnp.asarray`."
            )
        init_leaves, init_treedef = jtu.tree_flatten(initial_output)
        if init_treedef.num_leaves == 1 and init_treedef.num_nodes == 1:
            init_leaves = init_leaves * len(leaves)  # one value for every array
        elif init_treedef != treedef:
            raise ValueError(
                f"{_PREFIX}`initial_output` must be a single value or a PyTree of the "
                f"output's structure {treedef}, but got structure {init_treedef}."
            )
        init = [_fill(v, s) for v, s in zip(init_leaves, leaves)]
        self.module = module
        self.output_index = eqx.nn.StateIndex(jtu.tree_unflatten(treedef, init))

    def __call__(
        self, event: bool | BoolScalarLike, x: PyTree, state: eqx.nn.State
    ) -> tuple[PyTree, eqx.nn.State]:
        """**Arguments:**

        - `event`: a Python `bool` or a boolean scalar array (may be traced).
        - `x`: the input passed on to the wrapped module.
        - `state`: an `eqx.nn.State` holding this wrapper's state.

        **Returns:**

        A pair `(output, state)`: the module's fresh output and advanced state if
        `event` is true, else the previous output and `state` unchanged.
        """
        event = _check_event(event)
        previous = state.get(self.output_index)
        inner_state = state.substate(self.module)

        def update(inner_state):
            output, inner_state = _call(self.module, x, inner_state)
            new, old = jtu.tree_flatten(output), jtu.tree_flatten(previous)
            got, want = _describe(new[0]), _describe(old[0])  # dtypes and shapes
            if new[1] != old[1] or got != want:
                raise ValueError(
                    f"{_PREFIX}the wrapped module returned [{got}] but on "
                    f"`example_input` it returned [{want}]. Call it with inputs shaped "
                    "like `example_input`."
                )
            cast = jtu.tree_map(lambda a, b: jnp.asarray(a, b.dtype), output, previous)
            return cast, inner_state

        keep = lambda inner_state: (previous, inner_state)
        if isinstance(event, bool):
            output, inner_state = (update if event else keep)(inner_state)
        else:
            output, inner_state = jax.lax.cond(event, update, keep, inner_state)
        return output, state.update(inner_state).set(self.output_index, output)
