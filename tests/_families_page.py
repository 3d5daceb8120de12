"""Renders `docs/families.md`: every public class of each family, supported or not.

Run `python tests/_families_page.py` from the repository root to regenerate the page;
`tests/test_families.py` fails while it is out of date.
"""

from __future__ import annotations

import pathlib
import sys

import distrax
import numpyro.distributions as nd
import numpyro.distributions.transforms as nt
from tensorflow_probability.substrates import jax as tfp


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _cases import CASES, DISTRAX_NOT_CONSTRUCTIBLE  # noqa: E402

import eqxprob as ep  # noqa: E402


tfd, tfb = tfp.distributions, tfp.bijectors
PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "families.md"

HEADER = """\
# Supported families

`ep.FixedDistrax` wraps distributions and bijectors of three libraries through one
adapter each (`eqxprob/_families.py`): **distrax**, **TFP-JAX**
(`tensorflow_probability.substrates.jax`) and **numpyro** (optional:
`pip install -e '.[numpyro]'` from the clone). Below, every public class of each
library, with its status:

- **tested**: built in the conformance matrix (`tests/test_conformance.py`, directly
  or nested in another case): its leaves are exactly its array arguments,
  `eqx.filter_grad` equals `jax.grad` of the raw object, and `partition`/`combine`,
  `tree_map`, `tree_at`, `jit`, `vmap`, `scan` (their values compared for one class
  in two, every class traced), serialisation and sample shapes hold;
- **accepted**: a concrete class that `FixedDistrax` takes, not in the matrix. It goes
  through the same adapter as the tested classes of its family, so it is expected to
  work; a failure is a bug worth reporting;
- **unsupported**: rejected with a `TypeError` at construction, for the reason given.

Python floats given as arguments become array leaves, except where a class branches
on them in Python: those stay static and are listed here.

| family | class | argument kept a static float |
| --- | --- | --- |
| distrax | `RationalQuadraticSpline` | `range_min`, `range_max`, `min_bin_size` |
| numpyro | `transforms.DiscreteCosineTransform` | `smooth` |

Everywhere: a raw distribution or bijector instance as an *argument* is rejected
(its arrays would be hidden from JAX): wrap it too, `FixedDistrax(distrax.Normal,
loc, scale)`. Unhashable non-array arguments (e.g. numpyro constraint objects such
as `constraints.real` as a transform's `domain`) can be neither leaves nor static and
are rejected; leave such arguments at their defaults.

## Attributes

**A field is its argument.** `d.loc` is the `loc` you gave (or the array
`eqx.tree_at` put there), in every context: eagerly, under `jax.jit`, `jax.vmap`
and `eqx.filter_grad`, in a where-function at any depth, after a `tree_at` that put
a non-array there, on a partitioned tree. Static arguments (ints, strings, `None`,
callables, an explicit `None`) are attributes too; an argument left out is not
one, so its name is the library's. The library's own value of that name, where it
differs (distrax's `Categorical` normalises `probs`, `MultivariateNormalTri` keeps
the lower triangle of `scale_tri`, distrax and numpyro broadcast `loc` and `scale`
to the batch shape, numpyro's `NegativeBinomial2` computes a `mean` property from
its `mean` argument), is `d.instantiate().x`.

**Everything else is the library's own**, of the library's own kind: numpyro's
`mean`, `variance`, `mode` and `support` are values; distrax's and TFP's `mean()`,
`variance()` and `log_prob(x)` are calls. A method comes back bound to the
wrapper, as a PyTree (so `eqx.filter_jit(d.log_prob)` sees the wrapper's arrays as
inputs), and a wrapped argument of any method is built first. A method that
returns a distribution or bijector (numpyro's `to_event`) returns it wrapped, and
`d[index]` is the library's slice, wrapped, or a `TypeError` (see below).

## What a wrapper adds

Each addition exists because a library lacks, or spells otherwise, what the others
have, so that one piece of code runs on a wrapper of any family; where the library
has it, the library's own runs.

<ADDITIONS>

An argument named like an addition is the attribute (distrax's
`Categorical(dtype=int)`, `Lambda(forward=f)`): the addition is then
`ep.FixedDistrax.forward(d, x)`, the library's value `d.instantiate().dtype`.

## Where a wrapper differs from the raw object

`make peer` runs numpyro's and distrax's own test files against wrappers (see the
contributing guide). A test that passes on the raw class and fails wrapped is a
bug unless it meets one of these differences, which are by design:

- **`isinstance` and identity.** A wrapper is a `FixedDistrax`, not an instance of
  the wrapped class: `isinstance(d, dist.Normal)` is false and `type(d)` is
  `FixedDistrax`, so class-level reads of `type(d)` (a classmethod such as
  numpyro's `infer_shapes`, a method's annotations) see the wrapper's class. Use
  `d.cls`. (The wrapper does not pretend to be the class.)
- **An argument is the attribute** (above): where the library keeps a broadcast,
  normalised or computed array under an argument's name, `d.x` is still the
  argument, so that where-functions and gradients name what you gave; the
  library's is `d.instantiate().x`. So is an argument given as `None`: numpyro's
  `Wishart(c, None, None, scale_tril)` has `d.scale_matrix` `None`; leave the
  argument out and `d.scale_matrix` is numpyro's own, computed one.
- **A raw distribution or bijector as an argument** is rejected: its arrays would
  be hidden from JAX. Wrap it too.
- **The additions** (above) are there on every wrapper.
- **A slice or a method's distribution that cannot be wrapped faithfully** is a
  `TypeError` naming the raw way (`d.instantiate()[index]`).
  `FixedDistrax.from_instance` rebuilds a TFP object from its `.parameters`, TFP's
  own contract, and a distrax or numpyro one only where the rebuilt object keeps the
  very arrays it was given under each argument's name: not distrax's
  `Categorical`, `Softmax` or `MultivariateNormalDiag`/`Tri`, which keep computed
  arrays there, nor numpyro's `NegativeBinomial2.to_event`. (A rebuild from
  computed attributes could be silently wrong.)
- **Private attributes** (`d._x`) are not forwarded: only the library's public
  surface is.
- **Other libraries' free functions.** TFP's `kl_divergence` (which distrax's
  `kl_divergence` method and a raw TFP object's call) needs a private protocol of
  both its arguments (`_name_and_control_scope`), which a wrapper does not imitate:
  use the wrapper's own `p.kl_divergence(q)` (`q` wrapped or raw), or the built
  objects, `tfd.kl_divergence(p.instantiate(), q.instantiate())`. numpyro's
  `kl_divergence` and `vmap_over` take wrappers, in either position (registered
  through numpyro's public dispatch). numpyro's functions that check a
  distribution's class (`TruncatedDistribution`) take `d.instantiate()`; or wrap
  the class they return, `ep.FixedDistrax(nd.LeftTruncatedDistribution, d,
  low=0.0)`. A wrapper's `kl_divergence` between a numpyro and a distrax or TFP
  distribution raises a `TypeError` naming both: their KL registries do not know
  each other's classes.
- **`eqx.tree_at` on a static argument** (an int, or a static float such as a
  spline's `range_min`) is Equinox's "not a leaf" error, as for any static field of
  an Equinox module: build a new wrapper.
- **Float rounding** in the last bits of a value near 0 (under 1e-5), where a test
  asks a relative tolerance: a wrapper builds its object inside the traced
  program, so XLA may fold constants in another order.

This page is generated by `tests/_families_page.py`, and a test fails when it is out
of date.
"""

# What a wrapper adds, where, and why (a table on the page).
ADDITIONS = [
    (
        "`sample(seed=, sample_shape=)`",
        "numpyro (its own `sample(key, sample_shape)` works too)",
        "numpyro takes the key first, positionally",
    ),
    (
        "`sample_and_log_prob(seed=, sample_shape=)`",
        "TFP, numpyro",
        "TFP spells it `experimental_sample_and_log_prob`; numpyro has none",
    ),
    ("`prob(x)`, `log_cdf(x)`", "numpyro", "numpyro has `log_prob` and `cdf` only"),
    ("`stddev()`", "numpyro", "numpyro has `variance` only"),
    (
        "`kl_divergence(other)`, `cross_entropy(other)`",
        "numpyro",
        "numpyro's KL is a free function",
    ),
    ("`batch_shape`, `event_shape` as tuples", "TFP", "TFP's are `TensorShape`s"),
    ("`dtype`", "numpyro", "numpyro distributions have none (the dtype of a sample)"),
    (
        "`forward`, `inverse`, `forward_log_det_jacobian`, `inverse_log_det_jacobian`",
        "numpyro",
        "numpyro transforms are called, and have `inv` and "
        "`log_abs_det_jacobian(x, y)`",
    ),
    (
        "`forward_and_log_det`, `inverse_and_log_det`",
        "TFP, numpyro",
        "distrax's pairs, which the others lack",
    ),
    (
        "`event_ndims_in`",
        "TFP, numpyro",
        "distrax's name for TFP's `forward_min_event_ndims`, numpyro's "
        "`domain.event_dim`",
    ),
    (
        "`d(x)`, the same as `d.forward(x)`",
        "distrax, TFP",
        "distrax bijectors are not callable; TFP's `__call__` also transforms "
        "distributions",
    ),
]


NUMPYRO_FACTORIES = (
    "a factory function, not a class (it picks e.g. `CategoricalLogits` or "
    "`CategoricalProbs` from its arguments); wrap the class it returns"
)


def _tested_classes() -> set[type]:
    seen: set[type] = set()

    def record(cls, *args, **kwargs):
        seen.add(cls)
        return None

    for case in CASES.values():
        case.make(case.params, record)
    return seen


def _status(cls: object, name: str, tested: set[type], family_name: str) -> str:
    if family_name == "distrax" and name in DISTRAX_NOT_CONSTRUCTIBLE:
        return f"unsupported: {DISTRAX_NOT_CONSTRUCTIBLE[name]}"
    if not isinstance(cls, type):
        if family_name == "numpyro" and callable(cls) and name[0].isupper():
            return f"unsupported: {NUMPYRO_FACTORIES}"
        return ""  # not a class at all (a function or module): not listed
    try:
        ep.FixedDistrax.spec(cls)  # checks the class without calling it
    except TypeError as e:
        if "expects a distrax" in str(e):
            return "unsupported: not a distribution or bijector class (a helper)"
        reason = str(e).split("): ", 1)[1].split(" ", 1)[1]  # after the class name
        return f"unsupported: {reason.split(';')[0]}"
    return "tested" if cls in tested else "accepted"


def _section(title: str, module: object, names: list[str], tested, family) -> str:
    rows = []
    for name in sorted(names):
        status = _status(getattr(module, name), name, tested, family)
        if status:
            rows.append(f"| `{name}` | {status} |")
    counts = {
        s: sum(r.split("| ")[2].startswith(s) for r in rows)
        for s in ("tested", "accepted", "unsupported")
    }
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    return "\n".join(
        [f"## {title}", "", f"{summary}.", "", "| class | status |", "| --- | --- |"]
        + rows
    )


def render() -> str:
    tested = _tested_classes()
    sections = [
        ("distrax", distrax, list(distrax.__all__), "distrax"),
        ("TFP-JAX distributions (`tfd`)", tfd, list(tfd.__all__), "tfp"),
        ("TFP-JAX bijectors (`tfb`)", tfb, list(tfb.__all__), "tfp"),
        ("numpyro distributions", nd, list(nd.__all__), "numpyro"),
        ("numpyro transforms", nt, list(nt.__all__), "numpyro"),
    ]
    body = [_section(t, m, n, tested, f) for t, m, n, f in sections]
    rows = [f"| {a} | {b} | {c} |" for a, b, c in ADDITIONS]
    table = "\n".join(["| added | for | why |", "| --- | --- | --- |", *rows])
    return HEADER.replace("<ADDITIONS>", table) + "\n" + "\n\n".join(body) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
