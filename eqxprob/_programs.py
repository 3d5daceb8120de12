"""Compiled programs reused only when the lowered computation is identical.

`program(fn, args)` traces `fn` on `args` (flat lists of arrays) at every call, so
what runs is what the code says now, and lowers the trace to StableHLO. Its text,
without debug locations and with every constant written out in full, keys the
cache (by its SHA-256 digest, with the XLA options the caller compiles it with):
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

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.core
import jax.extend.core as jex


_MAX = 32  # programs kept; the least recently used goes first
_PROGRAMS: OrderedDict[bytes, Callable] = OrderedDict()
_LOCK = threading.Lock()
_UNCACHEABLE = ("callback", "CustomSPMDPartitioning", "__elided__")


class Traced(Exception):
    """`fn` reads a value of an outer JAX transformation (a `jax.vmap` around
    the caller, say): it cannot be compiled on its own."""


def program(
    fn: Callable[..., list], args: list, options: dict[str, str] | None = None
) -> tuple[Callable[..., list], bool]:
    """A compiled program computing `fn(*args)` as traced now: the one compiled
    for an identical lowering and equal XLA `options` (`jax.jit`'s
    `compiler_options`) before, or a new one (compiled at its first call), and
    whether it may be reused (no host callbacks).

    Raises `Traced` if the trace closes over a tracer."""
    options = options or {}
    closed = jax.make_jaxpr(fn)(*args)
    # (An outer trace's values that `fn` reads become extra inputs, or consts.)
    if len(closed.jaxpr.invars) != len(args) or any(
        isinstance(c, jax.core.Tracer) for c in closed.consts
    ):
        raise Traced
    # (Lowered through the program that would run it: JAX keeps that lowering
    # for its first call, so a new program is lowered once, not twice. Measured
    # on the VI and log-regression fits' first call: `docs/performance.md`.)
    made = _jitted(closed, fn, options)
    text = made.trace(*args).lower().as_text(debug_info=False)
    if any(word in text for word in _UNCACHEABLE):
        return made, False
    # (The text's digest, as JAX's persistent cache keys programs: a key of the
    # text itself would hold every constant of the program twice.)
    key = hashlib.sha256((repr(sorted(options.items())) + text).encode()).digest()
    with _LOCK:  # (the program found, or a new one, moved to the end: last used)
        made = _PROGRAMS[key] = _PROGRAMS.pop(key, None) or made
        if len(_PROGRAMS) > _MAX:
            _PROGRAMS.popitem(last=False)
    return made, True


def _jitted(closed: Any, fn: Callable, options: dict) -> jax.stages.Wrapped:
    """`jax.jit` of the closed jaxpr, named as `fn` (in JAX's messages)."""
    run = jex.jaxpr_as_fun(closed)

    def call(*args: Any) -> list:
        return run(*args)

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", "program")
    # (`keep_unused`: every input is in the lowered text, so two programs with
    # one text take the same inputs.)
    return jax.jit(call, keep_unused=True, compiler_options=options or None)
