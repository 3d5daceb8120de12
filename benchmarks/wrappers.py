"""What `FixedDistrax` costs, per family: eager time, trace time and compiled HLO vs
raw objects.

Raw objects are built inside the jitted function from the same arrays (they cannot
be passed through `eqx.filter_jit` as arguments), so both sides compile the same
maths. Run: `python benchmarks/wrappers.py`
"""

import time

import distrax
import jax
import jax.numpy as jnp
from _common import hlo_op_count, median_seconds, table
from tensorflow_probability.substrates import jax as tfp


try:
    import numpyro.distributions as nd
except ImportError:  # the optional family
    nd = None

import eqxprob as ep


tfd = tfp.distributions
N = 16
TRIL = jnp.tril(jnp.full((N, N), 0.1)) + jnp.eye(N)


PARAMS = {
    "loc": jnp.zeros(N),
    "scale": jnp.ones(N),
    "tril": TRIL,
    "shift": jnp.array(1.0),
    "factor": jnp.array(2.0),
}

# Each case builds its object from PARAMS through `W`: the wrapper or the raw class.
CASES = {
    ("distrax", "Normal"): lambda p, W: W(distrax.Normal, p["loc"], p["scale"]),
    ("distrax", "MultivariateNormalTri"): lambda p, W: W(
        distrax.MultivariateNormalTri, p["loc"], p["tril"]
    ),
    ("distrax", "Transformed(Normal, ScalarAffine)"): lambda p, W: W(
        distrax.Transformed,
        W(distrax.Normal, p["loc"], p["scale"]),
        W(distrax.ScalarAffine, p["shift"], p["factor"]),
    ),
    ("tfp", "Normal"): lambda p, W: W(tfd.Normal, p["loc"], p["scale"]),
    ("tfp", "LogNormal"): lambda p, W: W(tfd.LogNormal, p["loc"], p["scale"]),
    ("tfp", "MultivariateNormalTriL"): lambda p, W: W(
        tfd.MultivariateNormalTriL, p["loc"], p["tril"]
    ),
}
if nd is not None:
    CASES |= {
        ("numpyro", "Normal"): lambda p, W: W(nd.Normal, p["loc"], p["scale"]),
        ("numpyro", "MultivariateNormal"): lambda p, W: W(
            nd.MultivariateNormal, p["loc"], scale_tril=p["tril"]
        ),
        ("numpyro", "TransformedDistribution"): lambda p, W: W(
            nd.TransformedDistribution,
            W(nd.Normal, p["loc"], p["scale"]),
            W(nd.transforms.AffineTransform, p["shift"], p["factor"]),
        ),
    }


def _raw(cls, *args, **kwargs):
    return cls(*args, **kwargs)


def _trace_seconds(fn, *args, repeat=10):
    """Median time to trace and lower a fresh `jax.jit(fn)` (no cache hits)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.jit(lambda *a: fn(*a)).lower(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    x = jnp.linspace(-1.0, 1.0, N)
    rows = []
    for (family, name), make in CASES.items():
        wrapped = make(PARAMS, ep.FixedDistrax)
        raw = make(PARAMS, _raw)

        def raw_log_prob(p, x, make=make):
            return make(p, _raw).log_prob(x)

        def wrapped_log_prob(w, x):
            return w.log_prob(x)

        eager_raw = median_seconds(lambda raw=raw: raw.log_prob(x))
        eager_build = median_seconds(lambda: raw_log_prob(PARAMS, x))
        eager_wrapped = median_seconds(lambda w=wrapped: w.log_prob(x))
        trace_raw = _trace_seconds(raw_log_prob, PARAMS, x)
        trace_wrapped = _trace_seconds(wrapped_log_prob, wrapped, x)
        ops_raw = hlo_op_count(raw_log_prob, PARAMS, x)
        ops_wrapped = hlo_op_count(wrapped_log_prob, wrapped, x)
        rows.append(
            [
                family,
                name,
                f"{eager_raw * 1e6:.0f}",
                f"{eager_build * 1e6:.0f}",
                f"{eager_wrapped * 1e6:.0f}",
                f"{eager_wrapped / eager_raw:.2f}",
                f"{eager_wrapped / eager_build:.2f}",
                f"{trace_wrapped / trace_raw:.2f}",
                ops_raw,
                ops_wrapped,
                "yes" if ops_raw == ops_wrapped else "NO",
            ]
        )
    header = [
        "family",
        "distribution",
        "raw µs",
        "raw+build µs",
        "wrapped µs",
        "vs raw",
        "vs raw+build",
        "trace ratio",
        "HLO ops raw",
        "HLO ops wrapped",
        "equal",
    ]
    print(
        f"log_prob of a {N}-dimensional distribution; eager times are medians of 50 "
        "calls (raw: a prebuilt object; raw+build: built from the arrays per call, "
        "as the wrapper does); trace: jit+lower of a fresh function"
    )
    print(table(header, rows))
    print()
    construction()
    if nd is None:
        print("numpyro is not installed: `pip install 'eqxprob[numpyro]'`")


def construction(rounds: int = 5) -> None:
    """Building each object eagerly, wrapped vs raw, in interleaved rounds; with
    Python floats too (the wrapper turns them into arrays, as distrax does inside
    its methods: one compiled call for all the floats of a build, ~4 µs)."""
    cases = dict(CASES)
    cases[("distrax", "Transformed, ScalarAffine(1.0, 2.0)")] = lambda p, W: W(
        distrax.Transformed,
        W(distrax.Normal, p["loc"], p["scale"]),
        W(distrax.ScalarAffine, 1.0, 2.0),
    )
    if nd is not None:
        cases[("numpyro", "Normal(0.0, 1.0)")] = lambda p, W: W(nd.Normal, 0.0, 1.0)
    ratios: dict = {key: [] for key in cases}
    times: dict = {key: [] for key in cases}
    for r in range(rounds):
        keys = list(cases)
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            make = cases[key]
            t_raw = median_seconds(lambda make=make: make(PARAMS, _raw), repeat=30)
            t_wrapped = median_seconds(
                lambda make=make: make(PARAMS, ep.FixedDistrax), repeat=30
            )
            ratios[key].append(t_wrapped / t_raw)
            times[key].append((t_raw, t_wrapped))
    rows = []
    for (family, name), rs in ratios.items():
        t_raw, t_wrapped = sorted(times[(family, name)])[len(rs) // 2]
        rows.append(
            [
                family,
                name,
                f"{t_raw * 1e6:.0f}",
                f"{t_wrapped * 1e6:.0f}",
                f"{sorted(rs)[len(rs) // 2]:.2f}",
                f"{min(rs):.2f}-{max(rs):.2f}",
            ]
        )
    print(
        f"Construction, medians over {rounds} interleaved rounds (a build whose "
        "class, static arguments, shapes and dtypes were validated before is not "
        "validated again, except for numpyro and TFP with validate_args=True, which "
        "check values; a nested wrapper checked when built is not checked again)"
    )
    header = ["family", "object", "raw µs", "wrapped µs", "ratio", "range"]
    print(table(header, rows))


if __name__ == "__main__":
    main()
