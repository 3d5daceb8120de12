"""Running Python in a fresh interpreter, for tests that need their own process:
a benchmark script, an import without an optional package, or JAX with 8 forced
host devices (the device count is fixed when JAX starts)."""

from __future__ import annotations

import os
import socket
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


def run_processes(
    script: str, count: int, *args: str, timeout: float = 120
) -> list[subprocess.CompletedProcess]:
    """`python script INDEX COUNT PORT *args` in `count` processes at once, the
    coordinator of `jax.distributed` on a free localhost port (also given as a
    launcher would, in `COORDINATOR`, `NUM_PROCESSES`, `PROCESS_ID`); each process's
    result, whatever its exit status (a process still running after `timeout`
    seconds fails the test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    launcher = {"COORDINATOR": f"127.0.0.1:{port}", "NUM_PROCESSES": str(count)}
    processes = [
        subprocess.Popen(
            [sys.executable, script, str(i), str(count), port, *args],
            env={**os.environ, **launcher, "PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    results = []
    try:
        for p in processes:
            stdout, stderr = p.communicate(timeout=timeout)
            results.append(
                subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
            )
    finally:
        for p in processes:
            p.kill()
    return results
