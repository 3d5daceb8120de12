"""`ep.fit` and `ep.elbo` across processes (`jax.distributed`, issue #31): two
processes of two CPU devices each on localhost, every process holding only its
rows, against one process holding all of them on four devices (`_two_processes.py`
is what each process runs)."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
from _processes import run_processes


pytestmark = pytest.mark.slow  # (`make test-slow`)
WORKER = str(pathlib.Path(__file__).with_name("_two_processes.py"))


def checked(count: int) -> tuple[list, list]:
    """Each process's run and its printed results."""
    runs = run_processes(WORKER, count, "check")
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    return runs, [json.loads(run.stdout.strip().splitlines()[-1]) for run in runs]


def test_two_processes_train_and_differentiate_as_one_holding_every_row():
    (one,) = checked(1)[1]
    runs, two = checked(2)
    for process in two:
        # Its own rows only: two shards of 16 of the 64 rows, its half.
        assert process["shards"] == [[[16, 3], True]] * 2
        assert process["own_rows"]
        # The ELBO's gradient over all rows (its sum reduced across processes).
        for a, b in zip(process["grad"], one["grad"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        # The same minibatches (global row indices from the same key), the
        # same steps: the same trained guide and losses.
        for a, b in zip(process["fit"], one["fit"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(process["losses"], one["losses"], rtol=1e-10)
        assert process["explicit"] == np.float64(one["explicit"])
        # A non-finite loss stops every process at the same step, model attached.
        assert process["non_finite"] == one["non_finite"] == [1, -1.0]
    # Progress is shown by process 0 only.
    assert "7/7" in runs[0].stderr and "7/7" not in runs[1].stderr


def test_when_a_process_dies_the_others_fail_with_a_clear_error_not_hang():
    survivor, dead = run_processes(WORKER, 2, "die", timeout=90)
    assert dead.returncode == 3
    assert survivor.returncode != 0
    assert "the fit ended" not in survivor.stderr
    # Its collective fails at once (fit says which process, when, and how to
    # resume), or JAX's coordination service ends it once the dead process has
    # missed its heartbeats (5 s here).
    assert (
        "fit: process 0 of 2 stopped after" in survivor.stderr
        or "another task died" in survivor.stderr
    ), survivor.stderr[-3000:]


def test_the_multi_host_how_to_runs_in_two_processes(tmp_path):
    page = pathlib.Path(__file__).parents[1] / "docs/howto/multi_host.md"
    code = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    script = tmp_path / "train.py"
    script.write_text("\n".join(code))
    printed = []
    for count in (1, 2):
        for run in run_processes(str(script), count):
            assert run.returncode == 0, run.stderr[-3000:]
            printed.append(run.stdout.strip().splitlines()[-1].split(" ", 1))
    (one, *two) = printed
    assert [index for index, _ in two] == ["0", "1"]
    for _, loc in two:
        got, want = (np.array(v.strip("[]").split(), float) for v in (loc, one[1]))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
