"""`ep.summary` against the model's own values and metadata."""

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxprob as ep


class Kernel(eqx.Module):
    lengthscale: jax.Array = ep.field(
        constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
    )
    period: jax.Array = ep.field(
        constraint=ep.constraints.interval(1.0, 5.0), trainable=False
    )
    weights: jax.Array  # pyright: ignore[reportGeneralTypeIssues]  (`ep.field` sets no default)


class Model(eqx.Module):
    kernel: Kernel
    likelihood: ep.FixedDistrax
    count: int = 3


def _model():
    return Model(
        Kernel(jnp.array(1.5), jnp.array(2.5), jnp.linspace(0.0, 1.0, 10)),
        ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.array(0.1)),
    )


def _rows(table):
    return {row.path: row for row in table.rows}


def test_rows_of_a_raw_model():
    model = _model()
    rows = _rows(ep.summary(model))
    assert list(rows) == [
        "kernel.lengthscale",
        "kernel.period",
        "kernel.weights",
        "likelihood.loc",
        "likelihood.scale",
        "count",  # a Python int: a row, static, so never trained
    ]
    count = rows["count"]
    assert (count.shape, count.dtype, count.value, count.trainable) == (
        "()",
        "int",
        "3",
        False,
    )
    ls = rows["kernel.lengthscale"]
    assert (ls.shape, ls.dtype, float(ls.value)) == ("()", "float32", 1.5)
    assert ls.constraint == "positive" and ls.bijector == "softplus"
    assert ls.prior == "Gamma(concentration=2, rate=1)" and ls.trainable
    period = rows["kernel.period"]
    assert period.constraint == "interval(1.0, 5.0)" and not period.trainable
    weights = rows["kernel.weights"]
    w = np.asarray(model.kernel.weights)
    assert weights.value == f"mean {w.mean():.4g}, range [{w.min():.4g}, {w.max():.4g}]"
    assert weights.constraint == "" and weights.trainable


def test_a_parameterized_model_shows_the_same_values_and_its_nodes():
    model = _model()
    raw, params = _rows(ep.summary(model)), _rows(ep.summary(ep.parameterize(model)))
    assert list(raw) == list(params)
    for path in raw:
        assert params[path].value == raw[path].value, path
        assert params[path].bijector == raw[path].bijector, path
    assert params["kernel.period"].trainable is False  # a Frozen node
    assert params["kernel.lengthscale"].trainable is True  # a Bijector node


def test_plain_html_and_rich_renderings():
    table = ep.summary(_model())
    text = str(table)
    header = "path shape dtype value constraint bijector prior trainable"
    assert text.splitlines()[0].split() == header.split()
    assert len(text.splitlines()) == 2 + len(table.rows)
    page = table._repr_html_()
    assert page.startswith("<table>") and page.count("<tr>") == 1 + len(table.rows)
    assert "kernel.lengthscale" in page


def test_bounded_and_frozen_nodes():
    tree = {
        "b": ep.bounded(jnp.array([0.2, 0.4]), 0.0, 1.0),
        "f": ep.frozen(ep.positive(2.0)),
    }
    rows = _rows(ep.summary(tree))
    assert (
        rows["['b']"].value == "[0.2, 0.4]"
        and rows["['b']"].bijector == "sigmoid(0.0, 1.0)"
    )
    assert rows["['f']"].value == "2" and rows["['f']"].trainable is False


def test_python_numbers_get_rows_and_arrays_keep_theirs():
    tree = {"a": 1.0, "b": jnp.ones(3), "flag": True, "name": "static"}
    rows = _rows(ep.summary(tree))
    assert list(rows) == ["['a']", "['b']", "['flag']"]  # (strings get none)
    assert (rows["['a']"].dtype, rows["['a']"].value) == ("float", "1")
    assert rows["['flag']"].value == "True" and not rows["['a']"].trainable
    assert rows["['b']"].trainable


def test_a_gpjax_posterior_shows_constrained_values_and_frozen_flags():
    # GPJax 1.0 keeps parameters in paramax wrappers: each row is the parameter's
    # constrained value under its own name (not `._unconstrained`), and a
    # `NonTrainable` one is not trainable, as `ep.trainable` says.
    gpx = pytest.importorskip("gpjax")
    paramax = pytest.importorskip("paramax")
    with jax.enable_x64(True):
        prior = gpx.gps.Prior(
            mean_function=gpx.mean_functions.Zero(),
            kernel=gpx.kernels.RBF(lengthscale=2.5),
        )
        posterior = prior * gpx.likelihoods.Gaussian(obs_stddev=0.3)
        posterior = eqx.tree_at(
            lambda p: p.prior.kernel.variance,
            posterior,
            paramax.non_trainable(jnp.array(0.7)),
        )
        rows = _rows(ep.summary(posterior))
    assert list(rows) == [
        "prior.kernel.lengthscale",
        "prior.kernel.variance",
        "prior.mean_function.constant",
        "likelihood.obs_stddev",
    ]
    kernel = posterior.prior.kernel
    assert float(rows["prior.kernel.lengthscale"].value) == pytest.approx(
        float(paramax.unwrap(kernel.lengthscale)), rel=1e-5
    )
    assert float(rows["likelihood.obs_stddev"].value) == pytest.approx(0.3, 1e-5)
    assert rows["prior.kernel.lengthscale"].bijector == "PositiveReal"
    flags = {path: row.trainable for path, row in rows.items()}
    mask = ep.trainable(posterior)
    assert flags == {
        "prior.kernel.lengthscale": True,
        "prior.kernel.variance": False,
        "prior.mean_function.constant": any(
            jax.tree_util.tree_leaves(mask.prior.mean_function)
        ),
        "likelihood.obs_stddev": True,
    }


def test_a_guide_shows_its_posterior_in_constrained_space():
    class Model(eqx.Module):
        scale: jax.Array = ep.field(
            constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
        )
        w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))

    guide = ep.guide(Model(jnp.array(2.0), jnp.array([0.5, -1.0])))
    rows = _rows(ep.summary(guide))
    assert list(rows) == ["scale", "w"]  # the model's parameters, not loc/scale
    mean = guide.mean()
    assert float(rows["scale"].value) == pytest.approx(float(mean.scale), rel=1e-5)
    assert float(rows["scale"].value) == pytest.approx(2.0, rel=1e-5)  # not 1.85
    assert rows["w"].value == "[0.5, -1]"
    assert rows["scale"].constraint == "positive"
    assert rows["scale"].prior == "Gamma(concentration=2, rate=1)"


@pytest.mark.parametrize("family", ["distrax", "tfp", "numpyro"])
def test_a_raw_and_a_wrapped_prior_are_described_alike(family):
    """Class and numeric arguments, whether the prior is raw or wrapped (a raw
    one was its class name alone)."""
    if family == "distrax":
        gamma = distrax.Gamma
    elif family == "tfp":
        from tensorflow_probability.substrates import jax as tfp

        gamma = tfp.distributions.Gamma
    else:
        gamma = pytest.importorskip("numpyro.distributions").Gamma

    def described(prior):
        class Rate(eqx.Module):
            rate: jax.Array = ep.field(constraint=ep.constraints.positive, prior=prior)

        return ep.summary(Rate(jnp.array(1.0))).rows[0].prior

    raw = described(gamma(2.0, 0.5))
    assert raw == described(ep.FixedDistrax(gamma, 2.0, 0.5))
    assert raw == "Gamma(concentration=2, rate=0.5)"


def test_the_text_table_leaves_out_columns_empty_in_every_row():
    """A model without priors or constraints prints no such columns, so the
    table fits the page; `rows` keep every field."""
    table = ep.summary({"w": jnp.ones(2), "b": jnp.zeros(())})
    header = str(table).splitlines()[0].split()
    assert header == ["path", "shape", "dtype", "value", "trainable"]
    assert table.rows[0].prior == "" and "<th>prior</th>" not in table._repr_html_()
