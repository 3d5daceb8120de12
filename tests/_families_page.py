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
  `tree_map`, `tree_at`, `jit`, `vmap`, `scan`, serialisation and sample shapes hold;
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

A wrapper's field is named after its constructor argument, so `d.loc` could mean
the argument or the library's own `loc`. They agree wherever the library keeps the
argument as given (the same shape; a dtype conversion at most), and then `d.loc`
is the argument. Where the library computes its attribute from the arguments
(distrax's `Categorical` normalises `probs` and `logits`, `MultivariateNormalTri`
keeps the lower triangle of `scale_tri`, numpyro's `NegativeBinomial2` derives
`mean`) or broadcasts the argument to the batch shape (`loc` of
`Normal(0.0, jnp.ones(3))`), `d.x` raises a `TypeError` rather than pick one: the
argument is `d.arguments["x"]`, the library's value `d.instantiate().x`. This is
decided from the traced program that builds the object and reads the attribute,
so it holds under `jax.jit` as outside. Inside
`eqx.tree_at`'s where-function (`lambda d: d.scale_tri`), and on a tree that
cannot build its object (a partitioned tree, a prefix spec), `d.x` is the field as
stored. Attributes that are not arguments (`d.logits` of a wrapper given `probs`)
and static arguments (Python ints, strings, `None`: numpyro's
`precision_matrix=None`) are the library's, where it has them.

## Where a wrapper differs from the raw object

`make peer` runs numpyro's and distrax's own test files against wrappers (see the
contributing guide). A test that passes on the raw class and fails wrapped is a
bug unless it is one of these differences, which are by design:

- **`isinstance` and identity.** A wrapper is a `FixedDistrax` (an Equinox
  module), not an instance of the wrapped class: `isinstance(d, dist.Normal)` is
  false, and `type(d)` is `FixedDistrax`, so class-level reads of `type(d)` (a
  classmethod such as numpyro's `infer_shapes`, a method's annotations) see the
  wrapper's class. Use `d.cls`.
- **A raw distribution or bijector as an argument** is rejected (its arrays would
  be hidden from JAX): wrap it too.
- **Uniform methods.** `mean()`, `variance()`, `stddev()`, `mode()` are methods on
  every wrapper, also where numpyro has properties; `d.mean` without a call is the
  bound method.
- **Derived attributes** (above): `d.x` refuses to pick between the argument and
  the library's computed or broadcast `x`.
- **Float rounding** in the last bits of a value near 0 (under 1e-5), where a test
  asks a relative tolerance: a wrapper builds its object inside the traced
  program, so XLA may fold constants in another order.

## Calling conventions and the libraries' own functions

Every wrapper takes the uniform methods (`sample(seed=, sample_shape=)`,
`log_prob`, `prob`, `cdf`, `mean()`, `kl_divergence(other)`, ...) whatever its
family; a wrapped numpyro distribution also takes numpyro's own
`sample(key, sample_shape)`. A wrapper is accepted where each library dispatches
on classes, in either argument position, with wrapped or raw partners of its
family: numpyro's `kl_divergence` and `vmap_over`
(`numpyro.distributions.batch_util`), and TFP's `kl_divergence` registry, which
distrax's `kl_divergence` method also reads. numpyro's KL registry and
distrax/TFP's do not know each other's classes: a KL between a numpyro
distribution and a distrax or TFP one (wrapped or raw) raises a `TypeError`
naming both. numpyro's factory functions that check the class of a distribution
they are given (`TruncatedDistribution`) take the built object:
`dist.TruncatedDistribution(d.instantiate(), low=0.0)`.

This page is generated by `tests/_families_page.py`, and a test fails when it is out
of date.
"""

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
    return HEADER + "\n" + "\n\n".join(body) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
