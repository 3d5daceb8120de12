"""Kernels a training step launches on a GPU, counted without one: `peers.py`'s
programs at issue #28's GPU sizes, compiled by XLA for an NVIDIA H100.

JAX compiles ahead of time for a GPU described by a target config (deviceless
compilation, through the `jax-cuda13-plugin`): the optimised program is the one a
real H100 would run. For each variant this prints the kernels in the body of its
step loop (fusions, library calls such as cuBLAS' triangular solve, copies, and
loops nested in the step), the static trip count of that loop, and the seconds
XLA took to compile the program here. A small step's time on a GPU is mostly its
kernel launches, so a variant with more kernels per step is slower there; the
count is deterministic, so it can be compared where no GPU is lent. Nothing is
timed on a GPU: `peers.py` on a GPU is the measurement, this the proxy.

`ep.fit` lowers and compiles its chunks of steps in `eqxprob._programs.program`;
this script replaces that one function to capture the chunk and its inputs, and
compiles the chunk of the call's steps after its first four on the same inputs'
shapes, its constants split as `_programs.hoisted` splits them (the private
names it uses). The other variants are traced whole (`jax.make_jaxpr`) and compiled with
their arrays as inputs (what a jitted function closes over stays a constant, as
in a real run).

Run: `make gpu-kernels` (a venv of its own, `.venv-gpu`, with the plugin that
matches its jaxlib and NVIDIA's `ptxas`), or where those are installed
`JAX_PLATFORMS=cpu python benchmarks/gpu_kernels.py [--only TEXT]`.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.metadata
import os
import re
import sys
import time


os.environ.setdefault("JAX_PLATFORMS", "cpu")  # (the host compiles for the GPU)

import jax  # noqa: E402
import jax.extend.core as jex  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402
from _common import table  # noqa: E402
from jax.experimental import topologies  # noqa: E402

import eqxprob._programs  # noqa: E402


# An H100 SXM (80 GB HBM3), as `jax.devices()[0]` describes it on one.
H100 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448 cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 7 }
runtime_version { major: 13 minor: 0 patch: 0 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


@functools.cache
def _sharding() -> jax.sharding.NamedSharding:
    """One (deviceless) H100."""
    topology = topologies.get_topology_desc(
        platform="cuda", target_config=H100, topology="1x1x1"
    )
    mesh = topologies.make_mesh(topology, (1,), ("x",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _gpu(x) -> jax.ShapeDtypeStruct:
    """`x`'s shape and dtype, on the GPU."""
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=_sharding())


class _Captured(Exception):
    pass


def _fit_chunk(run: peers.Run, steps: int) -> jax.stages.Lowered:
    """The chunk `ep.fit` would compile for the most steps of `run(steps)`: its
    first four steps are two chunks of two, the rest one chunk on a GPU (a step
    takes well under 1/2048 s there), lowered for the GPU as `ep.fit` compiles
    it (the large constants as inputs, `eqxprob._programs`)."""
    captured = {}

    def capture(fn, args):
        captured.update(fn=fn, args=args)
        raise _Captured

    original, eqxprob._programs.program = eqxprob._programs.program, capture
    try:
        run(steps)
    except _Captured:
        pass
    finally:
        eqxprob._programs.program = original
    rest = functools.partial(captured["fn"], length=steps - 4)
    closed = jax.make_jaxpr(rest)(*captured["args"])
    evaluate, given = eqxprob._programs.hoisted(closed)
    evaluate = eqxprob._programs._reading_all(evaluate)  # (as `program` does)
    return jax.jit(evaluate).lower(
        list(map(_gpu, given)), list(map(_gpu, captured["args"]))
    )


def _traced(run: peers.Run, steps: int) -> jax.stages.Lowered:
    """`run(steps)` traced whole, its arrays as inputs, lowered for the GPU."""
    closed = jax.make_jaxpr(lambda: run(steps))()
    jaxpr = closed.jaxpr  # (its constants made its inputs)
    opened = jaxpr.replace(constvars=[], invars=[*jaxpr.constvars, *jaxpr.invars])
    fn = jex.jaxpr_as_fun(jex.ClosedJaxpr(opened, []))
    return jax.jit(fn).lower(*map(_gpu, closed.consts))


def _computations(text: str) -> dict[str, list[str]]:
    found = re.finditer(r"\n(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", text, re.S)
    return {m.group(1): m.group(2).split("\n") for m in found}


def _kernels(lines: list[str]) -> collections.Counter:
    kinds = collections.Counter()
    for line in lines:
        op = re.search(r" = (?:\([^=]*?\)|\S+) ([\w-]+)\(", line)
        if op and op.group(1) not in NOT_KERNELS:
            kinds[{"custom-call": "library call", "while": "loop"}.get(
                op.group(1), op.group(1))] += 1  # fmt: skip
    return kinds


def step_loop(text: str) -> tuple[collections.Counter, str]:
    """The kernels of the compiled program's step loop (the loop body with the
    most kernels) by kind, and that loop's static trip count."""
    computations = _computations(text)
    loops = [(re.search(r"body=%?([\w.\-]+)", line), line)
             for line in text.split("\n") if " while(" in line]  # fmt: skip
    body, line = max(
        ((m.group(1), line) for m, line in loops if m),
        key=lambda found: sum(_kernels(computations[found[0]]).values()),
    )
    trips = re.search(r'known_trip_count":\{"n":"(\d+)"', line)
    return _kernels(computations[body]), trips.group(1) if trips else "dynamic"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="problems whose name has this")
    parser.add_argument("--compiles", type=int, default=3, help="fresh compiles a row")
    args = parser.parse_args()
    try:
        importlib.metadata.version("jax-cuda13-plugin")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(
            "gpu_kernels.py compiles for a GPU through JAX's CUDA plugin, which this "
            "Python lacks: run `make gpu-kernels` (a venv of its own, .venv-gpu)."
        )
    rows = []
    for name, make, steps in peers.problems(small=False):
        if args.only not in name:
            continue
        runs = {v: run for v, run in make().items() if v != "numpyro svi.run"}
        # (`svi.run` is a Python loop of jitted steps.) The variants compiled in
        # turn, the order reversed every other round: XLA's first compiles of a
        # process are slower.
        seconds, texts = {v: [] for v in runs}, {}
        for r in range(args.compiles):
            for variant in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                jax.clear_caches()  # (else JAX returns the program compiled before)
                if variant == "eqxprob":
                    lowered = _fit_chunk(runs[variant], steps)
                else:
                    lowered = _traced(runs[variant], steps)
                start = time.perf_counter()
                texts[variant] = lowered.compile().as_text()
                seconds[variant].append(time.perf_counter() - start)
        for variant, text in texts.items():
            kinds, trips = step_loop(text)
            detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            first = variant == next(iter(texts))
            rows.append([name if first else "", variant, sum(kinds.values()), detail,
                         trips, f"{min(seconds[variant]):.2f}"])  # fmt: skip
        print(f"  done: {name}", flush=True)
    print(
        f"Kernels per step on an NVIDIA H100 (compiled without one), float32, "
        f"jax {jax.__version__}; ep.fit's chunk of the steps after its first four; "
        f"XLA compile: min of {args.compiles} on this host"
    )
    header = ["problem", "variant", "kernels", "of which", "step loop trips",
              "XLA compile s"]  # fmt: skip
    print(table(header, rows))


if __name__ == "__main__":
    main()
