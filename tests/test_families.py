"""The family adapters, through `ep.FixedDistrax`: thread safety, key paths,
`FixedDistrax.from_instance` and `event_ndims_in`, numpyro as an optional third
family, and pins on every private upstream API relied upon."""

import io
import subprocess
import sys
import textwrap
import threading

import distrax
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import numpyro.distributions as nd
import numpyro.distributions.transforms as nt
import pytest
from _processes import run_python
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions
tfb = tfp.bijectors
KEY = jax.random.PRNGKey(0)


def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol, atol)


# --- pins on private upstream APIs ------------------------------------------


def test_import_leaves_jax_backend_unstarted():
    """After `import eqxprob` JAX's devices can still be chosen (nothing at
    import starts its backend): here 3 CPU devices."""
    code = (
        "import eqxprob, jax; jax.config.update('jax_num_cpu_devices', 3); "
        "print(len(jax.devices()))"
    )
    assert run_python("-c", code).stdout.strip() == "3"


def test_pin_numpyro_inverse_transform():
    inverse = type(nt.ExpTransform().inv)
    assert inverse.__name__ == "_InverseTransform", (
        "numpyro's `Transform.inv` no longer returns `_InverseTransform`: update "
        "eqxprob/_families.py:_Numpyro.abstract_reason."
    )
    with pytest.raises(TypeError, match="not constructible by itself"):
        ep.FixedDistrax(inverse, nt.ExpTransform())


def test_pin_tfp_bijector_not_implemented_marker():
    from tensorflow_probability.substrates.jax.internal import parameter_properties

    assert hasattr(parameter_properties, "BIJECTOR_NOT_IMPLEMENTED"), (
        "TFP's internal parameter_properties.BIJECTOR_NOT_IMPLEMENTED is gone: "
        "update eqxprob/_families.py:_continuous_parameters."
    )
    # Integer arrays for continuous parameters become floats (TFP would compute
    # in integers); integer ones (counts, permutations) stay integers.
    normal = ep.FixedDistrax(tfd.Normal, jnp.array(0), jnp.array(1))
    _close(normal.log_prob(0.5), tfd.Normal(0.0, 1.0).log_prob(0.5))
    permute = ep.FixedDistrax(tfb.Permute, jnp.array([1, 0]))
    assert jnp.issubdtype(permute.permutation.dtype, jnp.integer)


def test_pin_tfp_cache_is_keyed_by_input_identity():
    # The assumption behind the fresh references: TFP's cache hits only for the
    # very same input object. A traced call leaks into a later raw call with the
    # same input, but not into one with a fresh reference to it.
    loc, scale = jnp.array([0.2, 0.5]), jnp.array([1.0, 1.3])
    x = jnp.array([0.7, 1.9])
    jax.lax.scan(
        lambda c, _: (c, tfd.LogNormal(loc, scale).log_prob(x)), 0.0, None, length=1
    )
    with pytest.raises(jax.errors.UnexpectedTracerError):
        tfd.LogNormal(loc, scale).log_prob(x)
    fresh = tfd.LogNormal(loc, scale).log_prob(jnp.array(x, copy=True))
    _close(fresh, tfd.LogNormal(loc, scale).log_prob(jnp.array([0.7, 1.9])))
    # If this starts failing because TFP no longer leaks, the fresh references in
    # eqxprob/_families.py can go.


def test_pin_distrax_private_argument_attributes():
    # from_instance reads `_name` when distrax stores an argument privately.
    b = distrax.ScalarAffine(jnp.array(1.0), jnp.array(2.0))
    assert "_shift" in vars(b) or hasattr(b, "shift"), (
        "distrax.ScalarAffine no longer stores `shift`: update "
        "eqxprob/_families.py:_Distrax.argument."
    )
    assert isinstance(vars(distrax.Normal(0.0, 1.0))["_loc"], jax.Array)


def test_a_wrapper_is_a_pytree_node_keyed_by_argument_names():
    # One class, registered with keys: no class per set of argument names.
    d = ep.FixedDistrax(distrax.Normal, jnp.zeros(2), jnp.ones(2))
    b = ep.FixedDistrax(tfb.Shift, jnp.ones(2))
    assert type(d) is ep.FixedDistrax and type(b) is ep.FixedDistrax
    paths = [p for p, _ in jtu.tree_flatten_with_path(d)[0]]
    assert paths == [(jtu.GetAttrKey("loc"),), (jtu.GetAttrKey("scale"),)]
    with pytest.raises(AttributeError, match="immutable.*tree_at"):
        d.loc = jnp.ones(2)  # pyright: ignore[reportAttributeAccessIssue]


# --- thread safety ------------------------------------------------------------

X2 = jnp.array([0.7, 1.9])
LOC, SCALE = (0.2, 0.5), (1.0, 1.3)


def _log_prob(d, x):
    return d.log_prob(x)


def _inverse_terms(b, y):
    # `inverse` and its log-det go through TFP's cache (the inverse is looked up).
    x, ildj = b.inverse_and_log_det(y)
    return x + ildj


# name -> (wrapper, how to call it, the raw object, how to call that)
THREAD_CASES = {
    "distrax": (
        lambda: ep.FixedDistrax(distrax.Normal, jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
        lambda: distrax.Normal(jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
    ),
    "tfp": (
        lambda: ep.FixedDistrax(tfd.LogNormal, jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
        lambda: tfd.LogNormal(jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
    ),
    "tfp-bijector": (
        lambda: ep.FixedDistrax(
            tfb.Chain,
            [ep.FixedDistrax(tfb.Shift, jnp.array(LOC)), ep.FixedDistrax(tfb.Exp)],
        ),
        _inverse_terms,
        lambda: tfb.Chain([tfb.Shift(jnp.array(LOC)), tfb.Exp()]),
        lambda b, y: b.inverse(y) + b.inverse_log_det_jacobian(y),
    ),
    "distrax-over-tfp": (
        lambda: ep.FixedDistrax(
            distrax.Transformed,
            ep.FixedDistrax(distrax.Normal, jnp.array(LOC), jnp.array(SCALE)),
            ep.FixedDistrax(tfb.Exp),
        ),
        _log_prob,
        lambda: tfd.LogNormal(jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
    ),
    "numpyro": (
        lambda: ep.FixedDistrax(nd.LogNormal, jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
        lambda: nd.LogNormal(jnp.array(LOC), jnp.array(SCALE)),
        _log_prob,
    ),
    "numpyro-transform": (
        lambda: ep.FixedDistrax(nt.AffineTransform, jnp.array(LOC), jnp.array(SCALE)),
        _inverse_terms,
        lambda: nt.AffineTransform(jnp.array(LOC), jnp.array(SCALE)),
        lambda t, y: t.inv(y) - t.log_abs_det_jacobian(t.inv(y), y),
    ),
}


def _reference(name):
    """The raw object's value at a fresh copy of X2 (never touched by threads)."""
    _, _, make_raw, call_raw = THREAD_CASES[name]
    return np.asarray(call_raw(make_raw(), jnp.array(np.asarray(X2))))


def test_wrapped_calls_from_eight_threads_agree_with_raw():
    # 4 threads trace a `lax.scan` over the wrapper (with the same concrete input
    # array object, which TFP's cache keys on) and 4 call it eagerly, all at once.
    expected = {name: _reference(name) for name in THREAD_CASES}
    wrappers = {name: case[0]() for name, case in THREAD_CASES.items()}
    barrier = threading.Barrier(8)
    results, errors = [], []

    def traced(name):
        call = THREAD_CASES[name][1]

        def step(carry, _):
            return carry, call(carry, X2)

        return jax.lax.scan(step, wrappers[name], None, length=2)[1][-1]

    def eager(name):
        return THREAD_CASES[name][1](wrappers[name], X2)

    def work(kind):
        try:
            barrier.wait()
            for _ in range(3):
                for name in THREAD_CASES:
                    fn = traced if kind == "traced" else eager
                    results.append((name, kind, np.asarray(fn(name))))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in ["traced"] * 4]
    threads += [threading.Thread(target=work, args=("eager",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 8 * 3 * len(THREAD_CASES)
    for name, _, got in results:
        _close(got, expected[name], rtol=1e-5)
    # Nothing process-wide was changed: raw TFP still works on the shared input.
    _close(tfd.LogNormal(jnp.array(LOC), 1.3).log_prob(X2).shape, (2,))


def test_threads_building_a_new_kind_of_wrapper_get_one_class():
    # tfd.VonMises's names (loc, concentration) are used by no other test.
    barrier = threading.Barrier(8)
    built = []

    def build():
        barrier.wait()
        built.append(ep.FixedDistrax(tfd.VonMises, jnp.array(1.5), jnp.array(2.0)))

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({type(d) for d in built}) == 1
    assert len({jtu.tree_structure(d) for d in built}) == 1


def test_outer_tracer_used_inside_and_outside_a_scan():
    # A tracer of an outer `jit` used both in a `scan` body and after it: raw TFP
    # would hand the scan's tracer back outside it.
    d = ep.FixedDistrax(tfd.LogNormal, jnp.array([0.2, 0.5]), jnp.array([1.0, 1.3]))

    @jax.jit
    def f(x):
        _, inside = jax.lax.scan(lambda c, _: (c, d.log_prob(x)), 0.0, None, length=1)
        return inside[0], d.log_prob(x)

    inside, outside = f(X2)
    _close(inside, outside)
    _close(outside, _reference("tfp"))


# --- key paths and where-functions --------------------------------------------


class _Model(eqx.Module):
    dist: ep.FixedDistrax
    flow: ep.FixedDistrax


def _model():
    return _Model(
        ep.FixedDistrax(distrax.Normal, loc=jnp.zeros(3), scale=jnp.ones(3)),
        ep.FixedDistrax(
            tfb.Chain,
            [ep.FixedDistrax(tfb.Shift, jnp.ones(())), ep.FixedDistrax(tfb.Exp)],
        ),
    )


def test_key_paths_name_constructor_arguments():
    paths = [jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(_model())[0]]
    assert paths == [".dist.loc", ".dist.scale", ".flow.bijectors[0].shift"]


def test_where_functions_accept_argument_names():
    model = _model()
    where = lambda m: m.dist.scale
    assert ep.where_paths(where, model) == (
        jtu.GetAttrKey("dist"),
        jtu.GetAttrKey("scale"),
    )
    updated = ep.tree_at_all(model, ep.WhereDict({where: 2 * jnp.ones(3)}))
    _close(updated.dist.stddev(), 2.0)
    _close(eqx.tree_at(where, model, 3 * jnp.ones(3)).dist.variance(), 9.0)
    shift = ep.where_paths(lambda m: m.flow.bijectors[0].shift, model)
    assert jtu.keystr(shift) == ".flow.bijectors[0].shift"
    assert ep.WhereDict({"dist.loc": 1})[lambda m: m.dist.loc] == 1


def test_static_arguments_are_not_pytree_children():
    model = _model()
    inner = ep.FixedDistrax(distrax.Normal, jnp.zeros(3), jnp.ones(3))
    d = ep.FixedDistrax(distrax.Independent, inner, 1)
    assert d.reinterpreted_batch_ndims == 1
    with pytest.raises(ValueError, match="no pytree child 'reinterpreted_batch_ndims'"):
        ep.where_paths(lambda d: d.reinterpreted_batch_ndims, d)
    assert jtu.keystr(ep.where_paths(lambda m: m.dist, model)) == ".dist"


# --- printing -------------------------------------------------------------------


def test_nested_wrappers_print_as_their_class_and_arguments():
    text = eqx.tree_pformat(_model(), width=200)
    assert text == (
        "_Model(dist=Normal(loc=f32[3], scale=f32[3]), "
        "flow=Chain(bijectors=[Shift(shift=f32[]), Exp()]))"
    )
    assert "_Static" not in eqx.tree_pformat(_model(), width=40)
    assert "0x" not in eqx.tree_pformat(_model(), width=40)


# --- the interface for other modules -------------------------------------------


@pytest.mark.parametrize(
    "obj, kind",
    [
        (distrax.Normal(0.0, 1.0), "dist"),
        (tfd.Normal(0.0, 1.0), "dist"),
        (nd.Normal(0.0, 1.0), "dist"),
        (distrax.Tanh(), "bij"),
        (tfb.Exp(), "bij"),
        (nt.ExpTransform(), "bij"),
        (distrax.Normal, None),
        (ep.FixedDistrax(tfb.Exp), None),
        (jnp.zeros(2), None),
        (lambda x: x, None),
    ],
    ids=lambda v: getattr(v, "__name__", type(v).__name__),
)
def test_from_instance_takes_raw_objects_only(obj, kind):
    if isinstance(obj, ep.FixedDistrax):
        assert ep.FixedDistrax.from_instance(obj) is obj
    elif kind is None:
        with pytest.raises(TypeError, match="expects a distrax, TFP-JAX or numpyro"):
            ep.FixedDistrax.from_instance(obj)
    else:
        wrapped = ep.FixedDistrax.from_instance(obj)
        assert wrapped.is_distribution == (kind == "dist")


@pytest.mark.parametrize(
    "make, x",
    [
        (lambda: tfb.Chain([tfb.Shift(jnp.array(1.0)), tfb.Softplus()]), 0.3),
        (lambda: tfd.Gamma(jnp.array(2.0), jnp.array(1.5)), 0.3),
        (lambda: tfd.Independent(tfd.Normal(jnp.zeros(2), 1.0), 1), jnp.ones(2)),
        (lambda: nd.Gamma(jnp.array(2.0), jnp.array(1.5)), 0.3),
        (lambda: nd.Normal(jnp.zeros(2), jnp.ones(2)).to_event(1), jnp.ones(2)),
        (
            lambda: nd.TransformedDistribution(
                nd.Normal(0.0, 1.0), [nt.ExpTransform()]
            ),
            0.3,
        ),
        (lambda: nt.AffineTransform(jnp.array(1.0), jnp.array(2.0)), 0.3),
        (
            lambda: nd.MixtureSameFamily(
                nd.CategoricalLogits(jnp.zeros(2)), nd.Normal(jnp.zeros(2), 1.0)
            ),
            0.3,
        ),
        (lambda: distrax.Normal(jnp.zeros(2), jnp.ones(2)), jnp.ones(2)),
        (lambda: distrax.Tanh(), 0.3),
        (
            lambda: distrax.Independent(distrax.Normal(jnp.zeros(2), 1.0), 1),
            jnp.ones(2),
        ),
    ],
    ids=[
        "tfb.Chain",
        "tfd.Gamma",
        "tfd.Independent",
        "nd.Gamma",
        "nd.Independent",
        "nd.TransformedDistribution",
        "nt.AffineTransform",
        "nd.MixtureSameFamily",
        "distrax.Normal",
        "distrax.Tanh",
        "distrax.Independent",
    ],
)
def test_from_instance_is_equivalent_to_the_raw_object(make, x):
    raw = make()
    wrapped = ep.FixedDistrax.from_instance(raw)
    assert isinstance(wrapped, ep.FixedDistrax) and wrapped.cls is type(raw)
    assert all(eqx.is_array(v) for v in jtu.tree_leaves(wrapped))
    if wrapped.is_distribution:
        expected = raw.log_prob(x)
        _close(wrapped.log_prob(x), expected)
    elif isinstance(raw, nt.Transform):
        _close(wrapped.forward(x), raw(x))
    else:
        _close(wrapped.forward(x), raw.forward(x))
    assert ep.FixedDistrax.from_instance(wrapped) is wrapped


def test_from_instance_refuses_what_it_cannot_rebuild():
    # distrax's ScalarAffine keeps derived arrays (1/scale, log scale) under the
    # names of its optional arguments: rebuilding it would not be faithful.
    with pytest.raises(TypeError, match=r"distrax.ScalarAffine.*FixedDistrax\("):
        ep.FixedDistrax.from_instance(
            distrax.ScalarAffine(jnp.array(1.0), jnp.array(2.0))
        )
    with pytest.raises(TypeError, match="expects a distrax, TFP-JAX or numpyro"):
        ep.FixedDistrax.from_instance(jnp.zeros(2))


@pytest.mark.parametrize(
    "bijector, expected",
    [
        (tfb.Exp(), 0),
        (tfb.FillScaleTriL(), 1),
        (distrax.Tanh(), 0),
        (distrax.Block(distrax.Tanh(), 1), 1),
        (nt.ExpTransform(), 0),
        (nt.StickBreakingTransform(), 1),
        (ep.FixedDistrax(tfb.FillScaleTriL), 1),
        (ep.FixedDistrax(nt.LowerCholeskyTransform), 1),
    ],
    ids=[
        "tfb.Exp",
        "tfb.FillScaleTriL",
        "distrax.Tanh",
        "distrax.Block",
        "nt.Exp",
        "nt.StickBreaking",
        "wrapped-tfb",
        "wrapped-nt",
    ],
)
def test_event_ndims_in(bijector, expected):
    wrapped = ep.FixedDistrax.from_instance(bijector)
    assert wrapped.event_ndims_in == expected


def test_event_ndims_in_is_a_bijector_property():
    with pytest.raises(TypeError, match="only available on a wrapped bijector"):
        _ = ep.FixedDistrax(distrax.Normal, 0.0, 1.0).event_ndims_in


# --- numpyro, the optional family -----------------------------------------------


def _run(code: str, **env) -> str:
    env = {"PATH": "", "JAX_PLATFORMS": "cpu", "OPENBLAS_NUM_THREADS": "1", **env}
    return run_python("-c", textwrap.dedent(code), env=env, timeout=120).stdout


def test_import_without_numpyro_works_and_errors_name_the_extra():
    out = _run(
        """
        import sys
        sys.modules["numpyro"] = None  # blocks `import numpyro`
        import distrax, jax.numpy as jnp
        import eqxprob as ep
        d = ep.FixedDistrax(distrax.Normal, jnp.zeros(2), jnp.ones(2))
        print(float(d.log_prob(jnp.zeros(2)).sum()))
        try:
            ep.FixedDistrax.from_instance(object())
        except TypeError:
            pass
        Fake = type("Normal", (), {"__module__": "numpyro.distributions.continuous"})
        try:
            ep.FixedDistrax(Fake)
        except ImportError as e:
            print(e)
        """
    )
    lines = out.splitlines()
    assert float(lines[0]) == pytest.approx(-1.837877, abs=1e-5)
    assert len(lines) == 2
    for line in lines[1:]:
        assert "pip install -e '.[numpyro]'" in line


_SAVE_LOAD = """
import sys, equinox as eqx, jax, jax.numpy as jnp, numpyro.distributions as nd
import eqxprob as ep
path, mode = sys.argv[1], sys.argv[2]
def model(loc, scale):
    return {"prior": ep.FixedDistrax(
        nd.Independent, ep.FixedDistrax(nd.Normal, loc, scale), 1
    ), "flow": ep.FixedDistrax(nd.transforms.AffineTransform, loc, scale)}
# The control: raw numpyro's leaf order under this hash seed.
print([float(x) for x in jax.tree_util.tree_leaves(nd.Normal(1.0, 3.0))])
if mode == "save":
    eqx.tree_serialise_leaves(path, model(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])))
else:
    m = eqx.tree_deserialise_leaves(path, model(jnp.zeros(2), jnp.ones(2)))
    print(m["prior"].base_dist.loc.tolist(), m["prior"].base_dist.scale.tolist())
    print(m["flow"].loc.tolist(), m["flow"].scale.tolist())
"""


@pytest.mark.slow
def test_numpyro_round_trip_across_hash_seeds(tmp_path):
    # numpyro flattens its objects in an order set by a set of names, which
    # depends on PYTHONHASHSEED; wrapped, the order is the constructor's.
    path = str(tmp_path / "model.eqx")
    script = tmp_path / "save_load.py"
    script.write_text(_SAVE_LOAD)

    def run(mode, seed):
        return subprocess.run(
            [sys.executable, str(script), path, mode],
            check=True,
            capture_output=True,
            text=True,
            env={"PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu", "PATH": ""},
            timeout=120,
        ).stdout.splitlines()

    saved_raw_order = run("save", "1")[0]
    loaded = {seed: run("load", seed) for seed in ("6", "2")}
    # Control: under hash seeds 1 and 6, raw numpyro orders Normal's leaves
    # differently (numpyro 0.22), so a raw round trip would swap loc and scale.
    assert saved_raw_order != loaded["6"][0], (
        "raw numpyro's leaf order no longer depends on PYTHONHASHSEED for these "
        "seeds: pick two that differ, or drop this control."
    )
    for out in loaded.values():
        assert out[1:] == ["[1.0, 2.0] [3.0, 4.0]"] * 2


def test_numpyro_batch_shape_is_fresh_after_vmap():
    # A raw numpyro object keeps the batch shape it had when built; a wrapper is
    # rebuilt at each call, so inside `vmap` it sees the per-example shape.
    locs = jnp.zeros((5, 3))
    wrapped = ep.FixedDistrax(nd.Normal, locs, jnp.ones((5, 3)))
    shapes = []

    def f(d):
        shapes.append(d.batch_shape)
        return d.log_prob(jnp.zeros(3)).sum()

    values = jax.vmap(f)(wrapped)
    assert shapes == [(3,)]
    _close(values, nd.Normal(locs, 1.0).log_prob(jnp.zeros(3)).sum(-1))
    assert wrapped.batch_shape == (5, 3) and type(wrapped.batch_shape) is tuple


@pytest.mark.parametrize(
    "cls, other, value",
    [
        (nd.NegativeBinomial2, "concentration", jnp.array([0.0, 2.0, 7.0])),
        (nd.BetaProportion, "concentration", jnp.array([0.1, 0.5, 0.8])),
    ],
)
def test_numpyro_argument_named_mean_is_the_argument(cls, other, value):
    """numpyro's `NegativeBinomial2` and `BetaProportion` take an array `mean`: as
    every argument, `d.mean` is that array (numpyro's own `mean` property, computed
    from the arguments, is `d.instantiate().mean`)."""
    mean, c = jnp.array([0.2, 0.5, 0.7]), jnp.array([2.0, 3.0, 4.0])
    d = ep.FixedDistrax(cls, mean=mean, **{other: c})
    raw = cls(mean, c)
    paths = [jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(d)[0]]
    assert paths == [".mean", f".{other}"]
    assert d.mean is mean and d.arguments["mean"] is mean
    assert jax.jit(lambda d: d.mean)(d).shape == mean.shape
    _close(d.instantiate().mean, raw.mean)
    _close(d.variance, raw.variance)  # numpyro's property: a value
    _close(d.log_prob(value), raw.log_prob(value))
    grads = eqx.filter_grad(lambda d: d.log_prob(value).sum())(d)
    hand = jax.grad(lambda m, c: cls(m, c).log_prob(value).sum(), (0, 1))(mean, c)
    _close(grads.mean, hand[0])
    _close(grads.arguments[other], hand[1])
    moved = eqx.tree_at(lambda d: d.mean, d, mean / 2)
    assert moved.mean is not mean
    _close(moved.log_prob(value), cls(mean / 2, c).log_prob(value))
    with pytest.raises(ValueError, match=cls.__name__):
        ep.FixedDistrax(cls, mean=-mean, **{other: c})  # numpyro rejects it
    # numpyro's object keeps no `mean` to be wrapped again from: a clear error
    # naming the raw way (it was returned raw).
    with pytest.raises(TypeError, match=r"d\.instantiate\(\)\.to_event"):
        d.to_event(1)
    _close(d.instantiate().to_event(1).log_prob(value), raw.to_event(1).log_prob(value))


class _ShiftedNormal(nd.Normal):
    """A user's numpyro subclass (defined outside numpyro), as numpyro documents."""

    def log_prob(self, value):
        return super().log_prob(value - 1.0)


class _DoubleAffine(nt.AffineTransform):
    def __call__(self, x):
        return 2.0 * super().__call__(x)


def test_numpyro_user_subclasses_are_wrapped_like_distrax_and_tfp_ones():
    loc, scale, x = jnp.array([0.0, 1.0]), jnp.array([1.0, 2.0]), jnp.array(0.3)
    d, raw = ep.FixedDistrax(_ShiftedNormal, loc, scale), _ShiftedNormal(loc, scale)
    _close(d.log_prob(x), raw.log_prob(x))
    grads = eqx.filter_grad(lambda d: d.log_prob(x).sum())(d)
    hand = jax.grad(lambda m: _ShiftedNormal(m, scale).log_prob(x).sum())(loc)
    _close(grads.loc, hand)
    assert ep.FixedDistrax.from_instance(raw).cls is _ShiftedNormal
    t = ep.FixedDistrax(_DoubleAffine, jnp.array(1.0), jnp.array(3.0))
    _close(t.forward(x), _DoubleAffine(1.0, 3.0)(x))


def test_numpyro_uniform_method_set_matches_raw():
    loc, scale = jnp.array([0.1, 0.4]), jnp.array([1.0, 2.0])
    d, raw = ep.FixedDistrax(nd.Normal, loc, scale), nd.Normal(loc, scale)
    _close(d.mean, raw.mean)  # numpyro's properties are values
    _close(d.variance, raw.variance)
    _close(d.stddev(), jnp.sqrt(raw.variance))  # numpyro lacks it: the uniform one
    with pytest.raises(NotImplementedError):  # numpyro has no Normal.mode
        _ = d.mode
    support = d.support  # numpyro's constraint, as numpyro has it
    assert support is raw.support and bool(support(jnp.array(0.3)))
    _close(d.entropy(), raw.entropy())
    _close(d.cdf(0.3), raw.cdf(0.3))
    _close(d.log_cdf(0.3), jnp.log(raw.cdf(0.3)))
    _close(d.prob(0.3), jnp.exp(raw.log_prob(0.3)))
    np.testing.assert_array_equal(
        d.sample(seed=KEY, sample_shape=(4,)), raw.sample(KEY, (4,))
    )
    np.testing.assert_array_equal(d.sample(seed=0), raw.sample(KEY))
    # numpyro's own convention, positional, also under jit and vmap over keys
    np.testing.assert_array_equal(d.sample(KEY, (4,)), raw.sample(KEY, (4,)))
    np.testing.assert_array_equal(d.sample(KEY), raw.sample(KEY))
    np.testing.assert_array_equal(d.sample(0, 3), raw.sample(KEY, (3,)))  # int seed
    np.testing.assert_array_equal(
        d.sample(np.int64(0), np.int64(3)), raw.sample(KEY, (3,))
    )
    samples, log_prob = d.sample_and_log_prob(KEY, (2,))
    np.testing.assert_array_equal(samples, raw.sample(KEY, (2,)))
    keys = jax.random.split(KEY, 3)
    _close(jax.vmap(jax.jit(d.sample))(keys), jax.vmap(raw.sample)(keys))
    with pytest.raises(TypeError, match="one PRNG key"):
        d.sample(KEY, seed=KEY)
    with pytest.raises(TypeError, match="one PRNG key"):
        d.sample()
    samples, log_prob = d.sample_and_log_prob(seed=KEY, sample_shape=3)
    _close(log_prob, raw.log_prob(samples))
    assert d.dtype == jnp.float32
    assert (d.batch_shape, d.event_shape) == ((2,), ())
    q = ep.FixedDistrax(nd.Normal, jnp.array(1.0), jnp.array(2.0))
    _close(d.kl_divergence(q), nd.kl_divergence(raw, nd.Normal(1.0, 2.0)))
    _close(d.cross_entropy(q), raw.entropy() + d.kl_divergence(q))
    t = ep.FixedDistrax(nt.AffineTransform, jnp.array(1.0), jnp.array(2.0))
    raw_t = nt.AffineTransform(1.0, 2.0)
    x = jnp.array([0.3, -0.2])
    y, ldj = t.forward_and_log_det(x)
    _close(y, raw_t(x))
    _close(t(x), raw_t(x))
    _close(ldj, raw_t.log_abs_det_jacobian(x, raw_t(x)))
    _close(t.forward_log_det_jacobian(x), ldj)
    back, ildj = t.inverse_and_log_det(y)
    _close(back, raw_t.inv(y))
    _close(t.inverse(y), x)
    _close(ildj, -ldj)
    _close(t.inverse_log_det_jacobian(y), -ldj)


def test_numpyro_to_event_returns_a_wrapper_with_gradients():
    d = ep.FixedDistrax(nd.Normal, jnp.zeros(3), jnp.ones(3))
    event = d.to_event(1)
    assert isinstance(event, ep.FixedDistrax) and event.cls is nd.Independent
    assert event.event_shape == (3,)
    grads = eqx.filter_grad(lambda d: d.to_event(1).log_prob(jnp.ones(3)))(d)
    _close(grads.loc, jnp.ones(3))


def test_numpyro_factory_functions_are_refused_with_the_class_to_use():
    with pytest.raises(TypeError, match="factory function.*CategoricalLogits"):
        ep.FixedDistrax(nd.Categorical, logits=jnp.zeros(3))  # pyright: ignore[reportArgumentType]
    # numpyro's truncation checks its base's class: the message names the class
    # to wrap for these arguments, and the raw way; the class wrapped works.
    base = ep.FixedDistrax(nd.Normal, jnp.zeros(2), jnp.ones(2))
    with pytest.raises(TypeError, match=r"LeftTruncatedDistribution.*d\.instantiate"):
        ep.FixedDistrax(nd.TruncatedDistribution, base, low=0.0)  # pyright: ignore[reportArgumentType]
    x = jnp.array([0.5, 1.0])
    raw = nd.TruncatedDistribution(base.instantiate(), low=0.0)
    wrapped = ep.FixedDistrax(nd.LeftTruncatedDistribution, base, low=0.0)
    _close(wrapped.log_prob(x), raw.log_prob(x))
    grads = eqx.filter_grad(lambda d: d.log_prob(x).sum())(wrapped)
    hand = jax.grad(
        lambda m: nd.TruncatedDistribution(nd.Normal(m, 1.0), low=0.0).log_prob(x).sum()
    )
    _close(grads.base_dist.loc, hand(jnp.zeros(2)))


def test_numpyro_serialise_in_process():
    d = ep.FixedDistrax(nd.Normal, jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, d)
    buffer.seek(0)
    loaded = eqx.tree_deserialise_leaves(buffer, jtu.tree_map(jnp.zeros_like, d))
    assert loaded.loc.tolist() == [1.0, 2.0] and loaded.scale.tolist() == [3.0, 4.0]


def test_supported_families_page_is_up_to_date():
    import _families_page

    assert _families_page.PAGE.read_text() == _families_page.render(), (
        "docs/families.md is out of date: run `python tests/_families_page.py`."
    )


def test_pickle_round_trip():
    import pickle

    d = ep.FixedDistrax(nd.Independent, ep.FixedDistrax(nd.Normal, X2, X2), 1)
    again = pickle.loads(pickle.dumps(d))
    assert type(again) is type(d)
    assert jtu.tree_structure(again) == jtu.tree_structure(d)
    _close(again.log_prob(X2), d.log_prob(X2))


@pytest.mark.slow
def test_import_is_clean_under_warnings_as_errors_and_keeps_the_users_warnings():
    # tfp-nightly warns at import about JAX APIs it uses; `python -W error` (or a
    # project's `filterwarnings = error`) must still import eqxprob and use it, and
    # a warning from the user's own code afterwards must still be an error.
    use = (
        "import eqxprob as ep, distrax, jax.numpy as jnp; "
        "ep.FixedDistrax(distrax.Normal, jnp.zeros(2), 1.0).log_prob(0.0)"
    )
    mine = "; import warnings; warnings.warn('mine', DeprecationWarning)"
    run = lambda code: subprocess.run(  # noqa: E731
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": ""},
        timeout=120,
    )
    clean = run(use)
    assert clean.returncode == 0, clean.stderr[-2000:]
    raised = run(use + mine)
    assert raised.returncode != 0 and "DeprecationWarning: mine" in raised.stderr


def test_python_floats_stay_concrete_when_a_wrapper_is_built_under_jit():
    # As raw numpyro keeps them: its NumPy-mixing support checks then run on
    # values, and the wrapper built inside `jax.jit` scores as the raw one does.
    seen = []

    def score(x):
        d = ep.FixedDistrax(nd.Uniform, 0.0, 1.0)
        seen.append(isinstance(d.low, jax.core.Tracer))
        return d.log_prob(x)

    raw = jax.jit(lambda x: nd.Uniform(0.0, 1.0).log_prob(x))
    for x in (0.5, 2.0, -1.0):
        np.testing.assert_array_equal(jax.jit(score)(x), raw(x))
    assert seen and not any(seen)
