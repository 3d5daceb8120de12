"""Run the whole suite as strictly as Equinox runs its own.

- Strict dtype promotion: mixing dtypes (a float32 leaf with a float64 one, an
  int array with a float array) is an error rather than a silent promotion, so a
  test sees any place where eqxprob would change a user's dtype.
- Warnings are errors (`filterwarnings = ["error", ...]` in pyproject.toml);
  upstream warnings that eqxprob cannot fix are filtered there by exact message.

Upstream code that is not strict-clean itself (optax's bias correction, some
distrax/TFP/numpyro classes, blackjax's adaptation) cannot run under strict
promotion. A test that needs it is marked `@pytest.mark.standard_promotion(
"<the upstream line>")` and runs under standard promotion; nothing else is.
"""

import importlib.metadata
import os


# Compiled without LLVM's optimisations (XLA's own HLO passes all run): every
# program of the suite compiles about a sixth faster, and each comparison's two
# sides are compiled alike. Read when JAX starts its backend, after this line;
# the suite's subprocesses inherit it.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

import jax  # noqa: E402
import pytest


jax.config.update("jax_numpy_dtype_promotion", "strict")


def pytest_report_header(config):
    """The versions this run resolved (CI's fresh venv takes the newest allowed)."""
    names = ["jax", "jaxlib", "equinox", "distrax", "tfp-nightly", "optax", "numpyro"]
    return "eqxprob against: " + ", ".join(
        f"{n} {importlib.metadata.version(n)}" for n in names
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "standard_promotion(reason): run under standard dtype promotion, because "
        "upstream code the test needs is not strict-clean (reason: which line)",
    )


@pytest.fixture(autouse=True)
def _standard_promotion_if_marked(request):
    marker = request.node.get_closest_marker("standard_promotion")
    if marker is None:
        yield
        return
    if not marker.args:
        raise ValueError("standard_promotion needs the upstream reason")
    with jax.numpy_dtype_promotion("standard"):
        yield


# --- per-file durations, printed at the end of every run (also under xdist) -----

_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _DURATIONS[path] = _DURATIONS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _DURATIONS:
        return
    terminalreporter.section("time per test file (setup + call + teardown)")
    for path, seconds in sorted(_DURATIONS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_DURATIONS.values()):8.1f} s  in all")


def pytest_collection_modifyitems(config, items):
    """Under xdist (`--dist loadgroup`, pyproject.toml), all conformance tests of
    one class run on one worker, so its compiled functions (cached per class in
    test_conformance.py) are compiled once rather than once per worker."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module.__name__ == "test_conformance" and "name" in params:
            item.add_marker(pytest.mark.xdist_group(params["name"]))

    # The docs site's build (one group of about a minute and a half, on one
    # worker) first, so that it runs beside the other tests, not alone after them.
    def last(item) -> bool:
        group = item.get_closest_marker("xdist_group")
        return group is None or group.args[:1] != ("docs_site",)

    items.sort(key=last)  # (stable: the rest keep their order)
