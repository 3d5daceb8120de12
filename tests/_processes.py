"""Running Python in a fresh interpreter, for tests that need their own process:
a benchmark script, an import without an optional package, or JAX with 8 forced
host devices (the device count is fixed when JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping


def run_python(
    *args: str,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`python *args` with this test run's interpreter; fails the test with the
    end of its stderr if it exits non-zero, else returns the completed process
    (read `.stdout`)."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def on_8_devices(
    code: str, cwd: str | os.PathLike | None = None
) -> subprocess.CompletedProcess:
    """`python -c code` on 8 forced host (CPU) devices."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    return run_python("-c", code, cwd=cwd, env=env)
