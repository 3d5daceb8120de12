"""Counting XLA compilations, for tests that a call compiles nothing new."""

from __future__ import annotations

import jax


class Compilations:
    """Counts XLA compilations (backend compiles) while active: `with
    Compilations() as c: ...`, then `c.count`; and lowerings to StableHLO,
    `c.lowerings`."""

    EVENT = "/jax/core/compile/backend_compile_duration"
    LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"

    def __enter__(self):
        self.count = self.lowerings = 0

        def listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
            if event == self.EVENT:
                self.count += 1
            if event == self.LOWERING:
                self.lowerings += 1

        self._listener = listener
        jax.monitoring.register_event_duration_secs_listener(listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)
