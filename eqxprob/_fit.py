"""`fit`: train a model with gradients + optax, in compiled chunks of steps.

Everything a call's signature fixes (which leaves are trained, the checked loss,
the optimiser state's shape, the compiled chunk) is worked out once and cached
(`_Plan`), so a repeated call costs little more than one dispatch per chunk. A
chunk is a `lax.while_loop` whose step count is an argument, with the optimiser
initialised inside it on the first chunk, so neither `steps` nor the chunk
lengths (chosen at run time so the progress bar moves about four times a second)
compile anything new. The loss and optimiser are compared by structure
(`_hashing.Keyed`), so a fresh but equal `lambda` or `optax.adam(...)` reuses the
compiled program too. A model small enough that XLA:CPU runs its steps without
scheduling them gets a second program after its first 100,000 steps, with the
steps in blocks (`_block`). Under a JAX transformation the chunks are traced into
the caller's program instead.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import numbers
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal
from jaxtyping import Array, PRNGKeyArray, PyTree

from ._families import to_device
from ._hashing import key as structural_key, remembered
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

    opt_state: Any
    step: int = eqx.field(static=True)


class _Problem:
    """The static part of a fit: loss, optimiser and how batches and keys reach
    the loss. Hashed and compared by structure (see `_hashing`)."""

    __slots__ = ("loss", "optimiser", "batch_size", "rows", "takes_key", "traced", "_k")

    def __init__(self, loss_fn, optimiser, batch_size, rows, takes_key):
        self.loss = remembered(loss_fn)
        self.optimiser = remembered(optimiser)
        self.batch_size, self.rows, self.takes_key = batch_size, rows, takes_key
        # The loss or optimiser reads a tracer (of a `jax.vmap` around `fit`):
        # the fit is traced, and its plan, never met again, is not cached.
        self.traced = self.loss.traced or self.optimiser.traced
        self._k = (self.loss, self.optimiser, batch_size, rows, takes_key)

    def __hash__(self) -> int:
        return hash(self._k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Problem) and self._k == other._k


_SHAPING = frozenset({"broadcast_in_dim", "convert_element_type", "reshape", "copy"})


def _zero_outputs(closed: Any) -> bool:
    """Whether every output of the closed jaxpr is zero whatever its inputs:
    zero literals or constants, and broadcasts, conversions and reshapes of them
    (how `jnp.zeros_like` states trace)."""

    def zero(v: Any, known: set) -> bool:
        return _is_zero(v.val) if isinstance(v, Literal) else id(v) in known

    jaxpr = closed.jaxpr
    known = {id(v) for v, c in zip(jaxpr.constvars, closed.consts) if _is_zero(c)}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _SHAPING and all(zero(v, known) for v in eqn.invars):
            known.update(id(v) for v in eqn.outvars)
    return all(zero(v, known) for v in jaxpr.outvars)


def _is_zero(x: Any) -> bool:
    """Every element +0 (what `np.zeros` makes: not -0.0)."""
    x = np.asarray(x)
    return bool(np.all(x == 0) and not np.any(np.signbit(x)))


def _in_optax(fn: Callable) -> Callable:
    """`fn` (optax's `init` or `update`) under standard dtype promotion: optax's
    own arithmetic is not strict-clean (`1 - decay**count` mixes the int32 count
    with a float), so `ep.fit` works for a user who sets
    `jax_numpy_dtype_promotion="strict"`; the loss keeps the user's setting
    (`_as_user`), also where an optimiser re-evaluates it (a line search)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            return fn(*args, **kwargs)

    return wrapped


def _as_user(loss: Callable) -> Callable:
    """`loss` under the dtype promotion in force where `fit` was called."""
    mode = jax.config.jax_numpy_dtype_promotion  # pyright: ignore[reportAttributeAccessIssue]

    def wrapped(*args: Any) -> Any:
        with jax.numpy_dtype_promotion(mode):
            return loss(*args)

    return wrapped


def _all_finite(tree: PyTree) -> Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


class _Plan:
    """Everything a fit's signature (problem, model structure, shapes and dtypes)
    fixes, worked out once and cached: which of the model's leaves are trained,
    the checked loss, the optimiser state's structure, and the compiled chunk.

    The chunk is a plain `jax.jit` of lists of arrays, so a call costs a C++
    dispatch and nothing is partitioned, hashed or re-initialised per call.
    `run(train, opt, fixed, start, length, fresh)` takes the trained leaves, the
    optimiser state's leaves, the other arrays (the model's untrained arrays, the
    data's leaves, the key) and three scalars (`_counters`; separate arguments
    rather than slices of one array: two fusions, ~10 ms of compile, fewer). With
    `fresh`, `opt` is `template`, zeros of the state's shapes, and the program
    initialises the state itself unless that is zeros already (`zero_init`): one
    program, and one dispatch per chunk. It returns the new leaves and
    `end + 1` floats: zeros, then the `length` losses in the slots just before
    the last, then 0 if every trained parameter is finite and NaN if not (no
    NaN otherwise, so `jax_debug_nans` flags only a non-finite fit). (`end` is
    `capacity`, plus `block` for a model small enough for blocks: `_block`.)
    """

    def __init__(self, problem, leaves, treedef, data, key, capacity):
        self.problem, self.treedef, self.capacity = problem, treedef, capacity
        model = jtu.tree_unflatten(treedef, leaves)
        indexed = jtu.tree_unflatten(treedef, list(range(len(leaves))))
        params_index, _ = eqx.partition(indexed, trainable(model))
        self.trained = jtu.tree_leaves(params_index)
        if not self.trained:
            raise ValueError(
                "fit: the model has nothing to train: no float arrays outside "
                "`ep.Frozen` nodes. Python floats and ints are static (never "
                "trained): pass `jnp.asarray(1.0)`, e.g. `ep.FixedDistrax("
                "distrax.Normal, jnp.asarray(0.0), jnp.asarray(1.0))`."
            )
        self.params_treedef = jtu.tree_structure(params_index)
        trained = set(self.trained)
        self.fixed = [
            i for i, x in enumerate(leaves) if i not in trained and eqx.is_array(x)
        ]
        # The model's non-array leaves (part of the signature, so constants here).
        self.skeleton = [
            None if i in trained or eqx.is_array(x) else x for i, x in enumerate(leaves)
        ]
        self.data_treedef = None if data is None else jtu.tree_structure(data)
        self.has_key = key is not None
        self.dtype = jnp.result_type(float)  # of the losses
        self.per_step: float | None = None  # seconds per step, on warm chunks

        params = jtu.tree_unflatten(
            self.params_treedef, [_strong(leaves[i]) for i in self.trained]
        )
        fixed = [leaves[i] for i in self.fixed]
        data_leaves = [] if data is None else jtu.tree_leaves(data)
        traced_loss = _trace_loss(self, params, fixed, data_leaves, key)
        init = _in_optax(problem.optimiser.value.init)
        closed, shapes = jax.make_jaxpr(lambda p: _strong(init(p)), return_shape=True)(
            params
        )
        # Most optimisers start from zeros whatever the parameters (adam, adamw,
        # sgd with momentum, their schedules): then the zero placeholder *is* the
        # initial state, and the chunk needs no `lax.cond` to initialise it (~5%
        # less to compile on a small model). L-BFGS, reduce_on_plateau and the
        # like keep the cond.
        self.zero_init = _zero_outputs(closed)
        shapes, self.opt_treedef = jtu.tree_flatten(shapes)
        self.opt_avals = [(s.shape, s.dtype) for s in shapes]
        try:
            zeros = [np.zeros(s.shape, s.dtype) for s in shapes]
        except TypeError:  # a dtype NumPy lacks (a PRNG key): a real state
            zeros = jtu.tree_leaves(jax.jit(lambda p: _strong(init(p)))(params))
        self.template = jax.device_put(zeros)
        self.block = _block(traced_loss, closed, self.dtype)
        # The flag's slot; the losses of `length` steps end just before it.
        self.end = capacity + (self.block or 0)
        self.run = jax.jit(self._chunk)
        self.steps_run = 0  # by `run`, in eager fits: when to compile `blocked`
        self._blocked: Any = None

    @functools.cached_property
    def _initial(self) -> Callable:
        """The optimiser's initial state of the trained leaves, compiled (made at
        the first fit under a mesh with `Explicit` axes). (`keep_unused`: a state
        of zeros reads no parameter, and the devices of a program without inputs
        are not the parameters' mesh.)"""
        init = _in_optax(self.problem.optimiser.value.init)
        return jax.jit(
            lambda train: jtu.tree_leaves(
                _strong(init(jtu.tree_unflatten(self.params_treedef, train)))
            ),
            keep_unused=True,
        )

    def start(self, train: list, opt: list | None = None) -> list:
        """The optimiser state a fit of `train` starts from: a fresh fit's
        (`opt=None`) or `opt`, a `FitState`'s leaves. That is `template` or
        `opt` as it is, except under a mesh with `Explicit` axes, where a
        sharding is part of an array's type and the loop's carry must keep its
        type: then the state is typed with the shardings the optimiser gives it
        (sharded as its parameters), the initial state itself or `opt` moved
        there (a state from a fit on one device, say)."""
        mesh = _explicit_mesh(train[0])
        if mesh is None:
            return self.template if opt is None else opt
        initial = self._initial(train)
        if opt is None:
            return initial
        if not isinstance(mesh, jax.sharding.Mesh):  # (abstract: traced)
            return opt
        return [
            x
            if isinstance(x, jax.core.Tracer)
            or getattr(x, "sharding", None) == i.sharding
            else jax.device_put(x, i.sharding)
            for x, i in zip(opt, initial)
        ]

    def program(self) -> tuple[Callable, bool]:
        """The compiled chunk for the next eager chunk, and whether it is new
        (its first call compiles): `run`, one flat loop, until a model small
        enough for blocks (`block`) has run `_BLOCKS_AFTER` steps with it, and
        from then on the chunk in blocks (`_block`), made then: it compiles
        ~15-40 ms longer, which the faster steps (~0.4 µs each) repay only over
        a long fit or many fits of one model."""
        if self.block is None or self.steps_run < _BLOCKS_AFTER:
            return self.run, False
        if self._blocked is None:
            self._blocked = jax.jit(functools.partial(self._chunk, blocked=True))
            return self._blocked, True
        return self._blocked, False

    def model(self, train: list, fixed: list) -> PyTree:
        leaves = list(self.skeleton)
        for i, x in zip(self.trained, train):
            leaves[i] = x
        for i, x in zip(self.fixed, fixed):
            leaves[i] = x
        return jtu.tree_unflatten(self.treedef, leaves)

    def split(self, fixed: list) -> tuple[list, Any, Any]:
        """The model's fixed arrays, the data and the two keys (batches, loss)."""
        n = len(self.fixed)
        data = None
        if self.data_treedef is not None:
            end = n + self.data_treedef.num_leaves
            data = jtu.tree_unflatten(self.data_treedef, fixed[n:end])
        keys = jax.random.split(fixed[-1]) if self.has_key else None
        return fixed[:n], data, keys

    def value(self, p: PyTree, fixed: list, data: Any, keys: Any, step: Any):
        # `step` is `None` exactly when there is no key to fold it into.
        """The loss of step `step` at trainable parameters `p`."""
        problem = self.problem
        args: list[Any] = [self.model(jtu.tree_leaves(p), fixed)]
        if data is not None:
            batch = data
            if problem.batch_size is not None:
                batch_key = jax.random.fold_in(keys[0], step)
                index = jax.random.randint(
                    batch_key, (problem.batch_size,), 0, problem.rows
                )
                batch = jtu.tree_map(lambda d: _rows(d, index), data)
            args.append(batch)
        kwargs = {"key": jax.random.fold_in(keys[1], step)} if problem.takes_key else {}
        return problem.loss.value(*args, **kwargs)

    def _chunk(
        self,
        train: list,
        opt: list,
        fixed: list,
        start: Array,
        length: Array,
        fresh: Array,
        blocked: bool = False,
    ) -> tuple:
        """`length` steps from global step `start` (in blocks of `block` steps
        if `blocked`). The loop body is one hand-written step plus the loss's
        write into the buffer; finiteness is read on the host from the losses
        and one flag, and `fit` replays a chunk that was not finite to find the
        step that broke."""
        # (A plain `GradientTransformation`, e.g. one of the user's own, takes no
        # `value=`/`grad=`/`value_fn=`: optax's wrapper drops them.)
        optimiser = optax.with_extra_args_support(self.problem.optimiser.value)
        mesh = next(filter(None, map(_explicit_mesh, (*train, *fixed))), None)
        fixed, data, keys = self.split(fixed)
        params = jtu.tree_unflatten(self.params_treedef, train)
        state = jtu.tree_unflatten(self.opt_treedef, opt)
        if not self.zero_init:
            state = jax.lax.cond(
                fresh,
                lambda p, s: _strong(_in_optax(optimiser.init)(p)),
                lambda p, s: _strong(s),
                params,
                state,
            )

        def step(p: PyTree, state: Any, left: Any) -> tuple:
            """One step, `left` steps (this one included) before the chunk's end."""

            def loss(q: PyTree) -> Array:  # (`start` only where it is read)
                step = start + length - left if self.has_key else None
                return self.value(q, fixed, data, keys, step)

            value, grads = jax.value_and_grad(loss)(p)
            updates, state = _in_optax(optimiser.update)(
                grads, state, p, value=value, grad=grads, value_fn=_as_user(loss)
            )
            return eqx.apply_updates(p, updates), state, value.astype(self.dtype)

        # One counter, down to 0, as a `lax.scan` has one; each loss is written
        # to slot `end - left` of its buffer. A bound carried unchanged through the
        # loop (`fori_loop(0, length, ...)`), or a second counter, lets XLA:CPU
        # hoist loop-invariant work (masks, iotas of constants) out of the body
        # into the loop state, which it does not do for a hand-written `lax.scan`
        # over the same loss: ~10% slower steps on the GP example.
        def steps(left, p, state, losses, end, before=None):
            """`left` steps, their losses to `losses[end - left : end]`, with
            `before` more steps of the chunk after them (in later blocks)."""

            def body(carry: tuple) -> tuple:
                i, p, state, losses = carry
                p, state, value = step(p, state, i if before is None else i + before)
                losses = jax.lax.dynamic_update_index_in_dim(losses, value, end - i, 0)
                return i - 1, p, state, losses

            carry = (left, p, state, losses)
            return jax.lax.while_loop(lambda c: c[0] > 0, body, carry)[1:]

        replicated = None if mesh is None else _named(mesh, [])
        losses = jnp.zeros((self.end + 1,), self.dtype, device=replicated)
        if not blocked:
            params, state, losses = steps(length, params, state, losses, self.end)
        else:
            # Blocks of `block` steps (the first one shorter if need be) whose
            # losses go to a buffer of 512 bytes, copied into the chunk's after
            # each block (`_block`). The first block's slots before its own steps
            # hold zeros, before the chunk's first loss.
            block = self.block

            def blocks(carry: tuple) -> tuple:
                left, p, state, blk, losses = carry
                n = (left - 1) % block + 1
                p, state, blk = steps(n, p, state, blk, block, before=left - n)
                at = self.end - left - (block - n)
                losses = jax.lax.dynamic_update_slice_in_dim(losses, blk, at, 0)
                return left - n, p, state, blk, losses

            blk = jnp.zeros((block,), self.dtype, device=replicated)
            carry = (length, params, state, blk, losses)
            _, params, state, _, losses = jax.lax.while_loop(
                lambda c: c[0] > 0, blocks, carry
            )
        # (The losses' finiteness is read on the host: a reduction over the buffer
        # here, after the loop, made a 30,000-step fit ~5% slower on XLA:CPU.)
        flag = jnp.where(_all_finite(params), 0.0, jnp.nan).astype(self.dtype)
        out = losses.at[self.end].set(flag)
        return jtu.tree_leaves(params), jtu.tree_leaves(state), out


def _explicit_mesh(x: Any) -> Any:
    """The mesh `x` is typed with if it has `Explicit` axes (`jax.make_mesh`'s
    default), else `None`. Under such a mesh an array's sharding is part of its
    type: the loss is typed replicated over the mesh, and the losses' buffer, the
    optimiser state and a batch must be typed to match (`_Plan.start`, `_rows`)."""
    if isinstance(x, jax.core.Tracer):
        sharding = jax.typeof(x).sharding
    else:  # (`x.sharding`: ~0.06 µs, `jax.typeof`: ~0.5)
        sharding = getattr(x, "sharding", None)
    if type(sharding) is jax.sharding.NamedSharding and (
        jax.sharding.AxisType.Explicit in sharding.mesh.axis_types
    ):
        return sharding.mesh
    return None


_BLOCKS_AFTER = 100_000  # steps of a small model before it compiles its blocks

# XLA:CPU runs a sequence of thunks (a loop body's) one after another, without
# the scheduling of its dataflow executor, when every buffer they use is at most
# this many bytes (`ThunkExecutor::Options::execute_sequential_buffer_threshold`).
_SEQUENTIAL_BYTES = 512


def _block(loss: Any, init: Any, dtype: Any) -> int | None:
    """Steps per block of the chunk's loop, or `None` for one flat loop.

    A small model's step (every array of the loss, of its inputs and of the
    optimiser state, i.e. of the closed jaxprs `loss` and `init`, at most
    `_SEQUENTIAL_BYTES`) runs ~2.8x faster on XLA:CPU when no buffer in the loop
    is larger (0.23 against 0.65 µs for 2 parameters and 32 points), but a
    chunk's losses fill `chunk_size` floats. Such a model's steps run in an inner
    loop of blocks whose losses fill a buffer of exactly that size, copied into
    the chunk's once a block. For a larger model the blocks would only add their
    copies (~4 µs a block): one flat loop."""
    if jax.default_backend() != "cpu":
        return None
    avals = itertools.chain(_avals(loss.jaxpr), _avals(init.jaxpr))
    if any(_nbytes(a) > _SEQUENTIAL_BYTES for a in avals):
        return None
    return _SEQUENTIAL_BYTES // np.dtype(dtype).itemsize


def _avals(jaxpr: Any) -> Any:
    """The avals of every variable of `jaxpr` and of the jaxprs it calls."""
    for v in itertools.chain(jaxpr.invars, jaxpr.constvars, jaxpr.outvars):
        yield v.aval
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            yield v.aval
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, ClosedJaxpr):
                    sub = sub.jaxpr
                if isinstance(sub, Jaxpr):
                    yield from _avals(sub)


def _nbytes(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    itemsize = getattr(getattr(aval, "dtype", None), "itemsize", 8)
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def _rows(data: Array, index: Array) -> Array:
    """The rows `index` of `data`. Under a mesh with `Explicit` axes the
    batch's sharding must be given: the data's own, if the batch splits evenly
    over the shards of the row axis (data parallel, as for the whole data), and
    otherwise the rows replicated (the other axes as the data's)."""
    mesh = _explicit_mesh(data)
    if mesh is None:
        return data[index]
    spec = jax.typeof(data).sharding.spec
    spec = [*spec, *[None] * (data.ndim - len(spec))]
    row = spec[0]
    names = () if row is None else (row,) if isinstance(row, str) else tuple(row)
    if index.shape[0] % np.prod([mesh.shape[n] for n in names], dtype=int):
        spec[0] = None
    return data.at[index].get(out_sharding=_named(mesh, spec))


def _named(mesh: Any, spec: list) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


_PLANS: dict[Any, _Plan] = {}  # by signature; the oldest goes first when full
_MAX_PLANS = 256


def _leaf_signature(x: Any) -> Any:
    """Shape and dtype of an array (weak types aside: `jax.jit` tells those
    apart itself, and `fit` makes the trained leaves strong), a float by its
    bits (0.0 and -0.0 compute differently, and a NaN is equal to a NaN), or
    the value (functions, e.g. an `eqx.nn.MLP`'s activation, by identity)."""
    if eqx.is_array(x):
        return (x.shape, x.dtype)
    if isinstance(x, (float, complex)):
        return structural_key(x)
    return (type(x), x)


def _plan(problem, leaves, treedef, data, key, capacity) -> _Plan:
    """The cached plan for this signature (made, and cached if hashable, if new)."""
    signature = (
        problem,
        treedef,
        tuple(map(_leaf_signature, leaves)),
        None
        if data is None
        else (
            jtu.tree_structure(data),
            tuple(map(_leaf_signature, jtu.tree_leaves(data))),
        ),
        None if key is None else (key.shape, key.dtype),
        capacity,
        jax.config.jax_enable_x64,  # pyright: ignore[reportAttributeAccessIssue]  (the losses' dtype, the placeholder)
    )
    if problem.traced:  # (cached, it would keep the tracer and its values alive)
        return _Plan(problem, leaves, treedef, data, key, capacity)
    try:
        plan = _PLANS.get(signature)
    except TypeError:  # an unhashable leaf or static field: not cached
        return _Plan(problem, leaves, treedef, data, key, capacity)
    if plan is None:
        plan = _Plan(problem, leaves, treedef, data, key, capacity)
        if len(_PLANS) >= _MAX_PLANS:
            del _PLANS[next(iter(_PLANS))]
        _PLANS[signature] = plan
    return plan


def _place_together(*groups: list) -> tuple[list, ...]:
    """If some of the arrays are committed to devices and some are not, commit
    the rest where the first committed one is (replicated over its mesh): a
    chunk fed committed arrays returns committed ones, and a second chunk fed
    those would otherwise compile again for the new placement."""
    arrays = [x for g in groups for x in g if isinstance(x, (jax.Array, np.ndarray))]
    committed = [x for x in arrays if getattr(x, "committed", False)]
    if not committed or len(committed) == len(arrays):
        return groups
    sharding = _replicated(committed[0])
    if sharding is None:
        return groups
    out = []
    for group in groups:
        loose = [
            j
            for j, x in enumerate(group)
            if isinstance(x, (jax.Array, np.ndarray))
            and not getattr(x, "committed", False)
        ]
        group = list(group)
        if loose:  # one batched transfer, not one per leaf
            placed = jax.device_put([group[j] for j in loose], sharding)
            for j, x in zip(loose, placed):
                group[j] = x
        out.append(group)
    return tuple(out)


def _replicated(x: Any) -> Any:
    """A sharding that puts a whole array on every device `x` is on (one device,
    or the mesh of a `NamedSharding`), or `None` for another kind of sharding."""
    sharding = x.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        return _named(sharding.mesh, [])
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return sharding
    return None


def _history(losses: list[np.ndarray], dtype: Any, like: Any) -> Array:
    """The losses of the chunks as one JAX array, where `like` (a chunk's
    output) is: on its device or replicated over its mesh, committed only if it
    is (a fit of uncommitted arrays returns uncommitted losses, as its model).
    By `_families.to_device` (~4 µs), where `jax.device_put` spends ~20 µs in
    Python and `jnp.asarray` compiles a copy once per length."""
    values = (
        losses[0]
        if len(losses) == 1
        else np.concatenate([np.zeros((0,), dtype), *losses])
    )
    if like is not None and (sharding := _replicated(like)) is not None:
        return to_device(values, sharding, like.committed)
    return jax.device_put(values)


def fit(
    model: PyTree,
    loss_fn: Callable[..., Array],
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
) -> tuple[PyTree, Array] | tuple[PyTree, Array, FitState]:
    """Minimise `loss_fn` over the trainable parameters of `model` with optax.

    The model is split with `ep.trainable`: only the unconstrained `param` of each
    `ep.Bijector` and plain float arrays reach the optimiser, so frozen values and a
    transform's own arrays (bounds) never move, weight decay included. Steps run
    in compiled chunks (a `lax.while_loop`) whose lengths are chosen at run time so
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
    by `rows / batch_size` is unbiased. Under a mesh with `Explicit` axes
    (`jax.make_mesh`'s default), where a sharding is part of an array's type, a
    batch is sharded as its data when `batch_size` splits evenly over the shards
    of the row axis, and its rows are replicated otherwise.

    **Compilation.** One program per model structure (and dtype), data shapes,
    batch size, loss and optimiser. The loss and optimiser compare by structure
    (code, closure and global values), so a fresh but equal `lambda` or
    `optax.adam(1e-3)` does not recompile, and neither does another `steps`. A
    different `chunk_size` does (it is the loss buffer's length). The comparison
    sees rebound globals, closure cells and defaults, the fields of Equinox
    modules, the attributes that the code, or the code of their class, reads of
    the user's objects (floats by their bits: 0.0 and -0.0 apart) and all the
    attributes of a library's objects (`optax.MultiSteps`); it takes as
    constant what libraries hold (attributes of their modules, the closures of
    their functions) and does not read what a class holds when read through
    the class (`Config.t`), a function's own attributes, or globals read only
    by another method the loss calls: after changing one of those, pass a new
    function. A model's static
    fields compare with `==`, as in `jax.jit`'s cache. A small model (every
    array of the loss, its data and the optimiser state at most 512 bytes: a few
    scalars) compiles one more program once it has run 100,000 steps: its steps
    in blocks, ~2.8x faster on the CPU, whose extra compile (~15-40 ms) a long
    fit or many fits repay; the losses and model are the same, bit for bit.

    **Chunks.** Each chunk is one compiled call and one copy of its losses to the
    host, where `fit` checks them, moves the bar and lets a Ctrl-C in. Chunk
    lengths adapt so that a chunk lasts about a quarter of a second, up to
    `chunk_size` steps, so the default (10,000) rarely needs changing: a chunk
    costs some tens of microseconds beyond its steps, under 1% even at a
    microsecond a step. Raise it when `fit` runs under `jax.jit` (below) for more
    steps than `chunk_size`, so that the compiled program holds one loop rather
    than one per chunk. Lowering it gains nothing (the lengths already follow the
    clock), and every value compiles a program of its own.

    **Under `jax.jit` or `jax.vmap`** (`jax.jit(lambda m: ep.fit(m, ...))`), the
    chunks become part of the traced program: nothing reaches the host, so there
    is no progress bar and no `NonFiniteLossError` (a non-finite loss shows in the
    losses), and the chunks are `chunk_size` steps each. So is a fit whose loss
    reads a value of an outer `jax.vmap` (`jax.vmap(lambda t: ep.fit(m, lambda
    x: (x - t) ** 2, ...))`). Forward-mode derivatives of the result
    (`jax.jvp`, `jax.jacfwd`) work; reverse mode (`jax.grad`) does not, as for
    any `lax.while_loop`.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` holding `ep.Bijector`s (resolve
      them inside `loss_fn` with `ep.resolve`).
    - `loss_fn`: as above.
    - `optimiser`: an optax `GradientTransformation` (called: `optax.adam(1e-2)`),
      or an `optax.MultiSteps` (its `gradient_transformation()` is used).
      Optimisers that need the loss value or function (`optax.lbfgs`, line
      searches, `optax.contrib.reduce_on_plateau`) get `value=`, `grad=` and
      `value_fn=` (the same batch and key).
    - `steps`: number of optimisation steps (a positive integer).
    - `data`: optional PyTree of arrays sharing a leading (row) axis.
    - `batch_size`: rows per step (needs `data`); `None` uses all rows.
    - `key`: a PRNG key, for minibatches and for a loss taking `key`.
    - `progress`: show a `tqdm.auto` bar (terminal or notebook) on stderr with the
      loss; `False` for none.
    - `chunk_size`: the most steps per compiled call (see **Chunks**).
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
    optimiser = _checked_optimiser(optimiser)
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

    leaves, treedef = jtu.tree_flatten(model)
    problem = _Problem(loss_fn, optimiser, batch_size, rows, takes_key)
    plan = _plan(problem, leaves, treedef, data, key, chunk_size)
    # Strong dtypes in, strong dtypes out: otherwise weakly typed inputs (e.g.
    # `jnp.array(0.0)`) compile the chunk a second time. (Through NumPy: no
    # dispatch, so nothing compiles.)
    train = [leaves[i] for i in plan.trained]
    train = [_strong_leaf(x) for x in train]
    fixed = [leaves[i] for i in plan.fixed]
    if data is not None:
        fixed += jtu.tree_leaves(data)
    if key is not None:
        fixed.append(key)
    if state is None:
        opt, fresh, first = plan.template, 1, 0
    else:
        opt, opt_treedef = jtu.tree_flatten(state.opt_state)
        if opt_treedef != plan.opt_treedef or any(
            _aval(x) != aval for x, aval in zip(opt, plan.opt_avals)
        ):
            raise ValueError(
                "fit: `state` does not match this model and optimiser (its "
                "optimiser state has another structure, shape or dtype). Pass the "
                "`FitState` of a fit of the same model with the same optimiser."
            )
        fresh, first = 0, state.step
    if problem.traced or any(
        map(isinstance, (*train, *opt, *fixed), itertools.repeat(jax.core.Tracer))
    ):
        return _traced(
            plan, train, opt, fixed, fresh, first, steps, leaves, return_state
        )
    train, opt, fixed = _place_together(train, opt, fixed)
    opt = plan.start(train, None if fresh else opt)

    bar = _progress_bar(progress, steps)
    losses: list[np.ndarray] = []
    end = plan.end
    # The first chunk of a new plan (which also compiles) is short, so the bar
    # appears at once; later ones last about `target` seconds, at most
    # `chunk_size` steps. A known plan starts at that length.
    target, known = 0.25, plan.per_step
    compiling = known is None
    length = (
        min(100, chunk_size) if known is None else _length(known, target, chunk_size)
    )
    done, trained, last = 0, None, None
    try:
        while done < steps:
            length = min(length, steps - done)
            began = time.perf_counter()
            counters = _counters(first + done, length, fresh)
            run, new = plan.program()
            compiling = compiling or new
            new_train, new_opt, last = run(train, opt, fixed, *counters)
            if isinstance(last, jax.core.Tracer):  # the loss reads a tracer (of a
                # `jax.vmap` around `fit`, the model's arrays concrete): traced too
                return _traced(
                    plan, train, opt, fixed, fresh, first, steps, leaves, return_state
                )
            out = np.asarray(last)
            chunk = out[end - length : end]
            if not np.isfinite(out[end - length :]).all():  # and the flag
                _raise_non_finite(
                    plan,
                    run,
                    train,
                    opt,
                    fixed,
                    fresh,
                    first + done,
                    chunk,
                    losses,
                    leaves,
                    first,
                    last,
                )
            train, opt, fresh, trained = new_train, new_opt, 0, new_train
            losses.append(chunk)
            done += length
            plan.steps_run += length
            if bar is not None:
                # (One redraw, by `update`: `set_postfix` would draw once more.)
                bar.set_postfix(loss=f"{float(chunk[-1]):.6g}", refresh=False)
                bar.update(length)
            per_step = (time.perf_counter() - began) / length
            if not compiling:
                plan.per_step = per_step
            # (The first chunk's time may include compiling: a shorter next one.)
            compiling = False
            length = _length(per_step, target, chunk_size)
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
    model = model if trained is None else _rebuild(plan, leaves, trained)
    history = _history(losses, plan.dtype, last)
    if return_state:
        if fresh:  # no chunk ran: the initial state, computed by a chunk of 0 steps
            _, opt, _ = plan.run(train, opt, fixed, *_counters(first, 0, 1))
        opt_state = jtu.tree_unflatten(plan.opt_treedef, opt)
        return model, history, FitState(opt_state, first + done)
    return model, history


def _counters(start: int, length: int, fresh: int) -> tuple:
    """A chunk's scalar arguments: its first (global) step, its number of steps
    and whether it initialises the optimiser state."""
    return np.int32(start), np.int32(length), np.bool_(fresh)


def _strong_leaf(x: Any) -> Any:
    if not getattr(x, "weak_type", False):
        return x
    if isinstance(x, jax.core.Tracer):
        return x.astype(x.dtype)
    if x.committed:  # where it is (through NumPy it would go to the default device)
        return jax.device_put(np.asarray(x), x.sharding)
    return np.asarray(x)


def _aval(x: Any) -> Any:
    if not eqx.is_array(x):
        return x
    return (x.shape, jax.dtypes.canonicalize_dtype(x.dtype))


def _length(per_step: float, target: float, chunk_size: int) -> int:
    """Steps that take about `target` seconds, between 1 and `chunk_size`."""
    return int(min(max(target / max(per_step, 1e-9), 1), chunk_size))


def _rebuild(plan: _Plan, leaves: list, values: list) -> PyTree:
    """The model of `leaves` with the trained ones replaced by `values`."""
    leaves = list(leaves)
    for i, x in zip(plan.trained, values):
        leaves[i] = x
    return jtu.tree_unflatten(plan.treedef, leaves)


def _traced(plan, train, opt, fixed, fresh, first, steps, leaves, return_state):
    """`fit` under a JAX transformation (`jax.jit`, `jax.vmap`, ...): the chunks
    become part of the traced program; nothing reaches the host, so there is no
    progress bar and no `NonFiniteLossError` (non-finite losses stay in the
    losses)."""
    losses, done = [], 0
    opt = plan.start(train, None if fresh else opt)
    while done < steps:
        length = min(plan.capacity, steps - done)
        counters = _counters(first + done, length, fresh)
        train, opt, out = plan.run(train, opt, fixed, *counters)
        losses.append(out[plan.end - length : plan.end])
        done, fresh = done + length, 0
    model = _rebuild(plan, leaves, train)
    history = losses[0] if len(losses) == 1 else jnp.concatenate(losses)
    if return_state:
        opt_state = jtu.tree_unflatten(plan.opt_treedef, opt)
        return model, history, FitState(opt_state, first + done)
    return model, history


def _check_int(name: str, value: Any) -> int:
    if type(value) is int and value >= 1:  # (the common case, without the ABC)
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"fit: `{name}` must be a positive integer, got {value!r}.")
    if value < 1:
        raise ValueError(f"fit: `{name}` must be a positive integer, got {value!r}.")
    return int(value)


def _checked_optimiser(optimiser: Any) -> optax.GradientTransformation:
    """`optimiser`, or the transformation of an optax wrapper that holds one
    (`optax.MultiSteps(...).gradient_transformation()`)."""
    if isinstance(optimiser, optax.GradientTransformation):
        return optimiser
    if isinstance(optimiser, optax.MultiSteps):
        return optimiser.gradient_transformation()
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
    if type(loss_fn) is types.FunctionType and not (
        hasattr(loss_fn, "__wrapped__") or hasattr(loss_fn, "__signature__")
    ):  # what `inspect.signature` reads, from the code object: ~10x faster
        code = loss_fn.__code__
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & inspect.CO_VARARGS)
        n += bool(code.co_flags & inspect.CO_VARKEYWORDS)
        return "key" in code.co_varnames[:n]
    try:
        parameters = inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False
    return "key" in parameters


def _trace_loss(plan: _Plan, params: PyTree, fixed: list, data: list, key: Any):
    """Trace the loss once (no compile), check that it returns a real scalar
    that depends on the trainable parameters, and return its closed jaxpr."""
    call = "loss_fn(model" + (", batch" if plan.data_treedef is not None else "")
    call += ", key=key)" if plan.problem.takes_key else ")"
    fixed = [*fixed, *data, *([] if key is None else [key])]

    def loss(p: PyTree, fixed: list) -> Array:
        fixed, data, keys = plan.split(fixed)
        return plan.value(p, fixed, data, keys, jnp.int32(0))

    try:
        closed, out = jax.make_jaxpr(loss, return_shape=True)(params, fixed)
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
    if not _depends_on_inputs(closed.jaxpr, len(jtu.tree_leaves(params))):
        raise ValueError(
            f"fit: `{call}` does not depend on any trainable parameter of the "
            "model, so training would change nothing (every loss the same). Use "
            "the model's arrays in the loss; Python floats and ints are static, "
            "and `ep.Frozen` values are not trained."
        )

    return closed


def _depends_on_inputs(jaxpr: Any, n: int) -> bool:
    """Whether any of the first `n` inputs of `jaxpr` is read by an equation or
    returned (a conservative test: an input read only by discarded work counts as
    used). Compared by identity, so literals never match."""
    inputs = {id(v) for v in jaxpr.invars[:n]}
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
    plan: _Plan,
    run: Callable,
    train: list,
    opt: list,
    fixed: list,
    fresh: int,
    start: int,
    chunk: np.ndarray,
    losses: list[np.ndarray],
    leaves: list,
    first: int,
    like: Any,
) -> None:
    """Replay a chunk that went non-finite one step at a time, from its start.

    The failing step is the first whose loss, or whose updated parameters (how a
    non-finite gradient shows), is not finite; the model raised with is the one
    at the start of that step. The replay reuses the compiled chunk, `run`.
    """
    i = 0
    for i in range(len(chunk)):
        counters = _counters(start + i, 1, fresh)
        new_train, new_opt, out = run(train, opt, fixed, *counters)
        out = np.asarray(out)
        finite = np.isfinite(out[plan.end - 1]) and np.isfinite(out[plan.end])
        if not (finite and np.isfinite(chunk[i])) or i == len(chunk) - 1:
            break
        train, opt, fresh = new_train, new_opt, 0
    step = start + i - first
    history = _history([*losses, chunk[: i + 1]], plan.dtype, like)
    raise NonFiniteLossError(
        f"fit: the loss or its gradient is not finite at step {step} "
        f"(loss = {float(history[-1])}). Training stopped; the model with the last "
        "finite parameters is attached as `error.model`. Lower the learning rate, "
        "check the loss for log/sqrt of non-positive values, or constrain the "
        "parameters (e.g. `ep.positive`).",
        step=step,
        model=_rebuild(plan, leaves, train),
        losses=history,
    )


def _progress_bar(progress: bool, steps: int) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=steps, unit="step", mininterval=0.25, file=sys.stderr)
