"""`make peer`: numpyro's and distrax's own test files, unedited, run against the raw
classes and against `ep.FixedDistrax` wrappers, with a table of the outcomes.

Downloads the source distributions of the installed numpyro and distrax from the
package index (`pip download --no-binary :all:`; nothing is copied into this
repository), runs the chosen test files twice with `peer/plugin.py` (raw, then
with the class under test wrapped), and prints, per suite: the applicable tests,
how many pass raw and wrapped, and each test that passes raw but fails wrapped,
in a category: a known by-design difference (docs/families.md, "Where a wrapper
differs from the raw object") or `bug` (the plugin notes numpyro's tests that
asked `isinstance(wrapper, its class)` anywhere in their body).

Run: `python peer/run.py [--sample N] [--keep DIR]` (`--sample`: one test in N of
numpyro's suite, default 50; distrax's files run whole: about 20 minutes on two
cores).
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile


HERE = pathlib.Path(__file__).resolve().parent
DISTRAX_FILES = [f"distrax/_src/distributions/{name}_test.py" for name in (
    "normal", "categorical", "bernoulli", "beta", "gamma", "mvn_diag", "mvn_tri",
    "laplace", "independent",
)]  # fmt: skip
SUITES = {
    "numpyro": ["test/test_distributions.py"],
    "distrax": DISTRAX_FILES,
}

# Known by-design differences (docs/families.md, "Where a wrapper differs from the
# raw object"), matched in order on a wrapped-only failure; anything else: `bug`.
BY_DESIGN = [
    ("the test inspects type(d): FixedDistrax, not the class",
     lambda f: "type object 'FixedDistrax'" in f.get("error", "")
     or re.match(r"AssertionError: FixedDistrax\.\w+ .* annot", f.get("error", ""))),
    ("isinstance or identity check in the test body",
     lambda f: f.get("isinstance_asked")
     or re.search(r"isinstance\(| is (?!not\b|None\b)", f.get("test_line", ""))),
    ("d.x is the argument x as given; the library's (broadcast, computed) is "
     "d.instantiate().x",
     lambda f: f.get("argument_differs")),
    ("a slice or a method's distribution that cannot be rebuilt faithfully: a "
     "TypeError naming d.instantiate()",
     lambda f: "cannot be wrapped: FixedDistrax.from_instance" in f.get("error", "")),
    ("TFP's kl_divergence needs its private protocol: p.kl_divergence(q) or "
     "instantiate()",
     lambda f: "_name_and_control_scope" in f.get("error", "")
     or re.match(r"NotImplementedError: No KL\(.*FixedDistrax", f.get("error", ""))),
    ("float rounding: |wrapped - raw| <= 1e-5 where the test asks a relative 1e-2",
     lambda f: _rounding(f.get("error", ""))),
    ("a raw distribution as a wrapper's argument",
     lambda f: "whose arrays would be hidden from JAX" in f.get("error", "")),
]  # fmt: skip


def _rounding(error: str) -> bool:
    """An `assert_allclose` failure whose every shown mismatch is below 1e-5 in
    absolute value: the last bits of a value near 0 (distrax's `Beta(1, 1)`
    log-density, -9.5e-7 raw, -0.0 from a wrapper closed over by `jax.jit`,
    where XLA folds the constants of a differently ordered program)."""
    pairs = re.findall(r"(\S+) \(ACTUAL\), (\S+) \(DESIRED\)", error)
    return bool(pairs) and all(abs(float(a) - float(d)) <= 1e-5 for a, d in pairs)


def _download(package: str, into: pathlib.Path) -> pathlib.Path:
    version = importlib.metadata.version(package)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--no-binary", ":all:", f"{package}=={version}", "-d", str(into)],
        check=True,
    )  # fmt: skip
    [archive] = into.glob(f"{package}-{version}.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"{package}-{version}"


def _run(root: pathlib.Path, files: list[str], mode: str, sample: int) -> dict:
    report = root / f"report-{mode}.jsonl"
    for old in root.glob(f"{report.name}.*"):
        old.unlink()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "plugin", "-p", "no:cacheprovider",
         "--rootdir", str(root), "--noconftest", "-o", "addopts=",
         f"--peer-mode={mode}", f"--peer-sample={sample}", f"--peer-report={report}",
         "-n", "2", "-W", "ignore", *files],
        cwd=root, env=_env(), check=False,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [line for part in root.glob(f"{report.name}.*")
             for line in part.read_text().splitlines()]  # fmt: skip
    return {e["id"]: e for e in map(json.loads, lines)}


def _env() -> dict:
    """The environment, with the plugin's folder first on `PYTHONPATH` (a
    checkout's own `PYTHONPATH`, which picks its eqxprob, kept after it)."""
    import os

    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _category(failure: dict) -> str:
    return next((name for name, match in BY_DESIGN if match(failure)), "bug")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--keep", type=pathlib.Path, help="keep the downloads here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or pathlib.Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        rows, bugs = [], []
        for package, files in SUITES.items():
            root = _download(package, base)
            sample = args.sample if package == "numpyro" else 1
            raw = _run(root, files, "raw", sample)
            wrapped = _run(root, files, "wrapped", sample)
            applicable = [i for i, e in raw.items() if e["applicable"]]
            passed = lambda r, i: r.get(i, {}).get("outcome") == "passed"  # noqa: E731
            only = [wrapped.get(i, {"id": i, "error": "not run"}) for i in applicable
                    if passed(raw, i) and not passed(wrapped, i)]  # fmt: skip
            categories = collections.Counter(map(_category, only))
            bugs += [f for f in only if _category(f) == "bug"]
            rows.append((
                f"{package} {importlib.metadata.version(package)}", len(applicable),
                sum(passed(raw, i) for i in applicable),
                sum(passed(wrapped, i) for i in applicable), len(only),
                "; ".join(f"{n}: {c}" for c, n in categories.most_common()) or "-",
            ))  # fmt: skip
    header = ("suite", "tests", "pass raw", "pass wrapped", "wrapped-only failures",
              "by category")  # fmt: skip
    widths = [max(len(str(r[k])) for r in [header, *rows]) for k in range(6)]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    for failure in bugs:
        print(f"\nbug: {failure['id']}\n  {failure.get('error', '')[:240]}")
    sys.exit(1 if bugs else 0)


if __name__ == "__main__":
    main()
