"""Compiled programs, reused only when the lowered computation is identical.

`program(fn, args)` traces `fn` on `args` (a flat list of arrays) at every call,
so what runs is what the code says now. The arrays the trace closes over (its
constants) larger than `_INLINE` bytes become inputs of the program, passed
with this call's values; smaller ones are written into it. The lowering of
that program to StableHLO, every input kept, keys the cache, with each input's
type and placement and the JAX configuration in force (`jax.config.values`):
a hit runs the executable compiled from an identical lowering
(`jax.jit(...).trace(...).lower().compile()`, never an old trace evaluated
again), a miss compiles this one. The cache so holds no array of the user's:
large ones are inputs, small ones copies inside a program, compared by value.

Not cached, and compiled at every call: a lowering that holds host callbacks
(`jax.pure_callback`, `jax.debug.print`: the text names them by index, not by
function) or custom partitioning, that takes inputs JAX adds itself (a
closed-over `jax.new_ref`, constants bound into the executable), or that runs
on several devices none of its inputs is committed to (a mesh the loss names
itself: the text holds its shape, not its devices). Constants of a
`jax.jit` nested in the trace stay in that inner program, so in the key by
value, like small ones."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np


_MAX = 32  # programs kept; the least recently used goes first
_PROGRAMS: OrderedDict[bytes, tuple[Any, dict]] = OrderedDict()
_LOCK = threading.Lock()
_UNCACHEABLE = ("callback", "CustomSPMDPartitioning")
# Constants of at most this many bytes are written into the program: index
# arrays such as `ep.lower_cholesky`'s, from which XLA compiles the SVGP
# example's step with 1-2 kernels fewer on an H100 than from inputs
# (`benchmarks/gpu_kernels.py`, M = 128 and 512; `docs/performance.md`).
_INLINE = 2**20


class Traced(Exception):
    """`fn` reads a value of an outer JAX transformation (a `jax.vmap` around
    the caller, say): it cannot be compiled on its own."""


def hoisted(closed: Any) -> tuple[Callable[[list, list], list], list]:
    """`(run, given)`: `run(given, args)` evaluates the closed jaxpr `closed` on
    `args` with its large constants taken from `given` (this call's values,
    on the device) and its small ones written in."""
    large = [_large(c) for c in closed.consts]
    given = [jnp.asarray(c) for c, big in zip(closed.consts, large) if big]

    def run(given: list, args: list) -> list:
        values = iter(given)
        consts = [next(values) if big else c for c, big in zip(closed.consts, large)]
        return jex.jaxpr_as_fun(jex.ClosedJaxpr(closed.jaxpr, consts))(*args)

    return run, given


def _large(constant: Any) -> bool:
    """Whether a constant becomes an input: a NumPy array, or a JAX array on no
    device of its own (uncommitted), of more than `_INLINE` bytes, or a key.
    Others stay constants, as `jax.jit` treats them: an array committed to a
    device (an input would pin the program there), a `jax.new_ref`."""
    if isinstance(constant, jax.Array):
        if constant.committed:
            return False
    elif not isinstance(constant, np.ndarray):
        return False
    aval = jax.typeof(constant)
    if jnp.issubdtype(aval.dtype, jax.dtypes.prng_key):
        return True  # (a key has no byte size of its own: as an input)
    return aval.size * aval.dtype.itemsize > _INLINE


def program(fn: Callable[..., Any], args: list) -> tuple[Callable[..., list], dict]:
    """`(run, notes)`: `run(*args)` runs the program compiled for `fn(*args)` as
    traced now (its large constants passed along), and `notes` is a dict kept
    with that program for as long as it is cached (a fresh one if it is not).

    Raises `Traced` if the trace closes over a tracer."""
    traced = jax.jit(_reading_all(fn)).trace(*args)
    closed = traced.jaxpr
    if len(closed.jaxpr.invars) != len(args) or any(
        isinstance(c, jax.core.Tracer) for c in closed.consts
    ):
        raise Traced
    given: list = []
    if any(map(_large, closed.consts)):  # (the program with them as inputs)
        run, given = hoisted(closed)
        run.__name__ = getattr(fn, "__name__", "program")
        traced = jax.jit(_reading_all(run)).trace(given, args)
    lowered = traced.lower()
    text = lowered.as_text(debug_info=False)
    placed = [(jax.typeof(x), _placement(x)) for x in [*given, *args]]
    # (with the JAX configuration in force: some of it sets how XLA compiles the
    # text, `jax_exec_time_optimization_effort` say, and none of it is shown)
    settings = sorted(jax.config.values.items())
    key = hashlib.sha256(repr((placed, settings, text)).encode()).digest()
    # (Every input read, so the text lists each one; an input JAX added, a
    # constant it binds into the executable, is none of ours.)
    main = re.search(r"func\.func public @main\((.*?)\) ->", text)
    inputs = main is not None and main[1].count("%arg") == len(given) + len(args)
    # (The text names a mesh by its axes, not its devices: those come from the
    # inputs' placement, in the key, and are unknown if none is committed.)
    one_device = "num_partitions = 1 " in text
    known = one_device or any(getattr(x, "committed", 0) for x in args)
    reusable = inputs and known and not any(w in text for w in _UNCACHEABLE)
    with _LOCK:  # (the program found, or a new one, moved to the end: last used)
        found = _PROGRAMS.pop(key, None) if reusable else None
    compiled, notes = found or (lowered.compile(), {})
    if reusable:
        with _LOCK:
            _PROGRAMS[key] = compiled, notes
            if len(_PROGRAMS) > _MAX:
                _PROGRAMS.popitem(last=False)
    if given:
        return lambda *args: compiled(given, list(args)), notes
    return compiled, notes


def _reading_all(fn: Callable) -> Callable:
    """`fn` reading every input, through an optimisation barrier: `jax.jit`
    drops inputs the program does not read, and two programs reading
    different inputs of one type would then lower to the same text."""

    def reads_all(*args: Any) -> Any:
        return fn(*jax.lax.optimization_barrier(args))

    reads_all.__name__ = reads_all.__qualname__ = getattr(fn, "__name__", "program")
    return reads_all


def _placement(x: Any) -> Any:
    """Where an input lives, as the compiled program depends on it: its sharding
    and which device holds which part, if it is committed to one, else the
    default device's."""
    if getattr(x, "committed", False):
        return x.sharding, x.sharding.devices_indices_map(x.shape)
    return jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
