"""The example scripts run (with small sizes) and produce what they claim."""

import importlib.util
import pathlib

import numpy as np


EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_distribution_recovers_the_sample_mean(capsys):
    model = _load("fit_distribution").main(steps=300, n=500)
    out = capsys.readouterr().out
    assert "fitted FixedDistrax(MultivariateNormalTri" in out
    # The data's true mean is (1, -2); 500 points put the sample mean within 0.15.
    np.testing.assert_allclose(np.asarray(model.loc), [1.0, -2.0], atol=0.15)


def test_update_on_event_example_runs(capsys):
    _load("update_on_event").main()
    out = capsys.readouterr().out
    assert "step" in out and "mean" in out
