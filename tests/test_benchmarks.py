"""The GP training benchmark runs, and all its variants train to the same model."""

import pathlib
import subprocess
import sys


BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def test_gp_training_benchmark_variants_agree():
    result = subprocess.run(
        [sys.executable, "gp_training.py", "--quick", "--steps", "3", "--rounds", "1"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [
        line for line in result.stdout.splitlines() if line.lstrip().startswith("200 ")
    ]
    variants = [row for row in rows if "not installed" not in row]
    assert (
        len(variants) >= 6
    )  # hand-written ×3 and eqxprob ×3, GPJax/paramax if present
    assert all(row.rstrip().endswith("yes") for row in variants), result.stdout
