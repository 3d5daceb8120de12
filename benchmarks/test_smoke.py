"""The GP training benchmark runs, and all its variants train to the same model."""

import pathlib
import subprocess

from _processes import run_python


BENCHMARKS = pathlib.Path(__file__).resolve().parent


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run a benchmark script from benchmarks/; it must succeed."""
    return run_python(script, *args, cwd=BENCHMARKS, timeout=600)


def test_gp_training_benchmark_variants_agree():
    result = _run("gp_training.py", "--quick", "--steps", "3", "--rounds", "1")
    rows = [
        line for line in result.stdout.splitlines() if line.lstrip().startswith("200 ")
    ]
    variants = [row for row in rows if "not installed" not in row]
    assert (
        len(variants) >= 6
    )  # hand-written ×3 and eqxprob ×3, GPJax/paramax if present
    assert all(row.rstrip().endswith("yes") for row in variants), result.stdout


def test_fit_overhead_benchmark_prints_every_row():
    result = _run("fit_overhead.py", "--quick")
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.count(" µs ") + line.count(" ms ") == 2
    ]
    names = ["GP n=20, per step", "GP n=200, per step", "whole call, 100 steps"]
    names += ["2-param, fixed cost", "GP n=20, fixed cost"]
    assert all(any(name in row for row in rows) for name in names), result.stdout
    assert sum("whole call" in row for row in rows) == 5, result.stdout


def test_peers_benchmark_prints_the_table_of_every_problem():
    """The table of issue #28 at CPU sizes: a time for each variant whose
    library is installed (GPJax and numpyro come with the test extra)."""
    out = _run(
        "peers.py", "--small", "--steps", "20", "--rounds", "2", "--compiles", "1"
    ).stdout
    rows = [line for line in out.splitlines() if line.lstrip().startswith(("SVGP",
            "exact GP", "mean-field VI"))]  # fmt: skip
    assert len(rows) == 18, out  # 6 problems: ms per step, compile s, XLA compile s
    for i, row in enumerate(rows):
        cells = row.split("  ")
        filled = [c for c in cells if c.strip() and c.strip() != "–"]
        expected = 5 if row.lstrip().startswith("mean-field") else 4
        if i >= 12:  # (XLA compile: hand-written, eqxprob and their ratio)
            expected = 4
        assert len(filled) == expected, row  # the problem and one cell a variant


def test_fit_loop_benchmark_prints_a_ratio_for_every_problem():
    """`ep.fit` against the same steps in a hand-written scan, at CPU sizes."""
    out = _run("fit_loop.py", "--small", "--steps", "20", "--rounds", "1").stdout
    names = ["logistic regression", "mean-field VI", "SVGP", "exact GP"]
    rows = [line for line in out.splitlines() if line.lstrip().startswith(tuple(names))]
    assert len(rows) == 4, out
    assert all(row.count("(") == 1 + ("(ep.guide" in row) for row in rows), out


def test_natgrad_benchmark_prints_both_tables():
    """benchmarks/natgrad.py at CPU smoke sizes: a time per step for eqxprob (adam,
    natural gradients + adam; in a lax.scan and through ep.fit) and GPJax 1.0's
    fit_natgrads, and natural gradients reaching 0.1% of the best ELBO."""
    out = _run("natgrad.py", "--quick").stdout
    timed = [
        "eqxprob adam", "eqxprob natural gradients + adam", "GPJax 1.0 fit_natgrads",
        "ep.fit adam", "ep.fit natural gradients + adam",
    ]  # fmt: skip

    def row(name: str) -> list[str]:
        found = [x for x in out.splitlines() if x.strip().startswith(name + " ")]
        assert found, out
        return found[0].split()

    for name in timed:
        assert row(name)[-2].replace(".", "").isdigit(), out  # (ms per step)
    assert row("natural gradients + adam")[-2].isdigit(), out  # (steps to target)
