"""Compiled programs reused only when the lowered computation is identical.

`run(fn, args)` traces `fn` on `args` (flat lists of arrays) at every call, so what
runs is what the code says now, and lowers the trace to StableHLO. Its text, without
debug locations and with every constant written out in full, is the cache key:
the criterion of JAX's own persistent compilation cache, exact because it is
what XLA compiles. Nothing about the Python objects `fn` reads (code, closures,
globals, attributes) is inspected: a changed global, a mutated container or a
patched helper changes the trace, hence the text, hence the program.

A cached program is `jax.jit` of the first matching trace's jaxpr (never of a
Python function, which could read other state when retraced), so JAX still
tells devices, shardings and weak types apart itself.

Not cached, and compiled at every call: a trace whose text holds host callbacks
(`jax.pure_callback`, `jax.debug.print`: the text names them by index, not by
function) or custom partitioning, or elided constants.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import jax
import jax.core
import jax.extend.core as jex


_MAX = 64  # programs kept; the least recently used goes first
_PROGRAMS: OrderedDict[str, Callable] = OrderedDict()
_LOCK = threading.Lock()
_UNCACHEABLE = ("callback", "CustomSPMDPartitioning", "__elided__")


class Traced(Exception):
    """`fn` reads a value of an outer JAX transformation (a `jax.vmap` around
    the caller, say): it cannot be compiled on its own."""


def program(fn: Callable[..., list], args: list) -> Callable[..., list]:
    """A compiled program computing `fn(*args)` as traced now: the one compiled
    for an identical lowering before, or a new one (compiled at its first call).

    Raises `Traced` if the trace closes over a tracer."""
    traced = jax.jit(fn).trace(*args)
    closed = traced.jaxpr
    # (An outer trace's values that `fn` reads become extra inputs, or consts.)
    if len(closed.jaxpr.invars) != len(args) or any(
        isinstance(c, jax.core.Tracer) for c in closed.consts
    ):
        raise Traced
    text = traced.lower().as_text(debug_info=False)
    if any(word in text for word in _UNCACHEABLE):
        return jax.jit(jex.jaxpr_as_fun(closed))
    with _LOCK:
        found = _PROGRAMS.get(text)
        if found is not None:
            _PROGRAMS.move_to_end(text)
            return found
        made = _PROGRAMS[text] = jax.jit(jex.jaxpr_as_fun(closed))
        if len(_PROGRAMS) > _MAX:
            _PROGRAMS.popitem(last=False)
    return made
