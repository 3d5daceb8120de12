"""pytest plugin of `make peer`: run numpyro's and distrax's own tests with the class
under test wrapped in `ep.FixedDistrax`, and record every test's outcome.

`--peer-mode=raw` runs the tests as they are; `--peer-mode=wrapped` makes the
class under test build wrappers: numpyro's `jax_dist` parameter (a class; its
factory functions are left alone) returns `ep.FixedDistrax(cls, ...)` when the
test module calls it; distrax's `self.distrax_cls` (set by
`EquivalenceTest._init_distr_cls`) becomes a subclass whose call does. A test
whose class is neither is "not applicable" in both modes.
`--peer-sample=N` keeps one test in N (by a hash of its id, the same in both
modes); `--peer-report=PATH` writes one JSON line per test. In wrapped mode it also
notes the tests that read an argument of a wrapper (`d.x`, the argument as given)
where the library's attribute of that name holds another value (`d.instantiate().x`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import zlib
from typing import Any

import numpy as np
import pytest

import eqxprob as ep


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("peer")
    group.addoption("--peer-mode", choices=("raw", "wrapped"), default="raw")
    group.addoption("--peer-sample", type=int, default=1)
    group.addoption("--peer-report", default=None)


@functools.cache
def _wrapped_class(cls: type) -> type:
    """A subclass of `cls` (so `issubclass` and class attributes hold) whose
    instances are `ep.FixedDistrax(cls, ...)`."""

    def call(_: Any, *args: Any, **kwargs: Any) -> Any:
        return ep.FixedDistrax(cls, *args, **kwargs)

    meta = type(cls.__name__ + "Meta", (type(cls),), {"__call__": call})
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    return meta(cls.__name__, (cls,), namespace)


def _accepted(cls: Any) -> bool:
    if not isinstance(cls, type):
        return False
    try:
        ep.FixedDistrax.spec(cls)  # (checks the class, calls nothing)
    except TypeError:
        return False
    return True


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    sample = config.getoption("--peer-sample")
    items[:] = [i for i in items if zlib.crc32(i.nodeid.encode()) % sample == 0]
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if _accepted(params.get("jax_dist")):
            _UNDER_TEST[item.nodeid] = params["jax_dist"]
        elif item.nodeid.split("::")[0].endswith("_test.py"):  # distrax's files
            _UNDER_TEST[item.nodeid] = None
    if config.getoption("--peer-mode") == "wrapped":
        _patch_numpyro()
        _patch_distrax()
        _patch_eqxprob()


# The class under test of each applicable test (`None`: distrax's, set in setUp).
_UNDER_TEST: dict[str, type | None] = {}
_CURRENT: list = [None, None, None]  # (the running test's class, module, id)
_ISINSTANCE_ASKED: set[str] = set()  # tests that asked isinstance(wrapper, cls)
_ARGUMENT_DIFFERS: set[str] = set()  # tests that read an argument the library changes


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    _CURRENT[:] = [_UNDER_TEST.get(item.nodeid), item.module.__name__, item.nodeid]
    yield
    _CURRENT[:] = [None, None, None]


def _patch_numpyro() -> None:
    """numpyro's tests compare classes by identity (`jax_dist is dist.LKJ`), so
    the class stays itself; an instance of the class under test that the test
    module builds (not numpyro's own code) is a wrapper instead."""
    from numpyro.distributions.distribution import DistributionMeta

    original = DistributionMeta.__call__

    def call(cls: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__")
        if cls is _CURRENT[0] and caller == _CURRENT[1]:
            return ep.FixedDistrax(cls, *args, **kwargs)
        return original(cls, *args, **kwargs)

    DistributionMeta.__call__ = call

    def instancecheck(cls: Any, obj: Any) -> bool:
        # (Noted: the test asked whether a wrapper is an instance of its class.)
        if isinstance(obj, ep.FixedDistrax) and issubclass(obj.cls, cls):
            _ISINSTANCE_ASKED.add(_CURRENT[2])
        return type.__instancecheck__(cls, obj)

    DistributionMeta.__instancecheck__ = instancecheck


def _patch_distrax() -> None:
    from distrax._src.utils import equivalence

    original = equivalence.EquivalenceTest._init_distr_cls

    def init(self: Any, distrax_cls: type) -> None:
        original(self, distrax_cls)
        if _accepted(distrax_cls):
            self.distrax_cls = _wrapped_class(distrax_cls)

    equivalence.EquivalenceTest._init_distr_cls = init


def _patch_eqxprob() -> None:
    """Note the tests that read `d.x` for an argument `x` whose library value
    differs (another value, shape or `None`-ness: broadcast, normalised, computed
    where the argument was `None`)."""
    original = ep.FixedDistrax.__getattribute__

    def getattribute(self: Any, name: str) -> Any:
        value = original(self, name)
        test = _CURRENT[2]
        if test is None or test in _ARGUMENT_DIFFERS or name.startswith("_"):
            return value
        if name in original(self, "__dict__") and name in original(self, "arguments"):
            try:
                library = getattr(original(self, "instantiate")(), name)
            except Exception:  # noqa: BLE001 - nothing to compare with
                return value
            if _differs(value, library):
                _ARGUMENT_DIFFERS.add(test)
        return value

    ep.FixedDistrax.__getattribute__ = getattribute


def _differs(argument: Any, library: Any) -> bool:
    if argument is library:
        return False
    if argument is None or library is None:
        return True
    try:
        if np.shape(argument) != np.shape(library):
            return True
        return not np.array_equal(np.asarray(argument), np.asarray(library))
    except Exception:  # noqa: BLE001 - traced, or not arrays: by shape only
        return False


_RESULTS: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and not report.passed):
        entry = {"id": item.nodeid, "outcome": report.outcome}
        if call.excinfo is not None and not report.skipped:
            excinfo = call.excinfo
            entry["error"] = f"{excinfo.typename}: {str(excinfo.value)[:300]}"
            crash = excinfo.traceback[-1]
            entry["statement"] = str(crash.statement).strip()[:200]
            # (The test file's own line that failed: a statement of the test body.)
            own = [e for e in excinfo.traceback if str(e.path) == str(item.path)]
            entry["test_line"] = str(own[-1].statement).strip()[:200] if own else ""
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["error"] = f"skipped: {report.longrepr[2]}"[:300]
        entry["applicable"] = item.nodeid in _UNDER_TEST
        entry["isinstance_asked"] = item.nodeid in _ISINSTANCE_ASKED
        entry["argument_differs"] = item.nodeid in _ARGUMENT_DIFFERS
        _RESULTS[item.nodeid] = entry


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("--peer-report")
    if path and _RESULTS:  # (each xdist worker writes its own file)
        with open(f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "w") as f:
            for entry in _RESULTS.values():
                f.write(json.dumps(entry) + "\n")
