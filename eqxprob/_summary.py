"""`summary`: a parameter table of a model, like GPJax's, read from the registry.

One row per array leaf or parameter node (`ep.Bijector`, `ep.Frozen`), with its
path (constructor-argument names inside `FixedDistrax`), shape, dtype, constrained
value, constraint and bijector (public names), prior and whether it trains. Plain
text by `str`, HTML in notebooks (`_repr_html_`), a `rich` table where `rich` is
installed (`__rich__`).
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.tree_util as jtu
import numpy as np
from jaxtyping import PyTree

from . import (
    _errors,
    _families,
    _metadata,
    _node,
    _parameter,
    _transforms,
    _variational,
)
from ._wrappers import FixedDistrax


@dataclasses.dataclass(frozen=True)
class Row:
    """One parameter: every field is a display string except `trainable`."""

    path: str
    shape: str
    dtype: str
    value: str
    constraint: str
    bijector: str
    prior: str
    trainable: bool


_COLUMNS = tuple(f.name for f in dataclasses.fields(Row))


class Summary:
    """The table `ep.summary` returns: `rows` (a list of `Row`), printed as plain
    text, rendered as HTML in notebooks and by `rich` where it is installed.

    **Example:**

    ```python
    import eqxprob as ep

    table = ep.summary({"scale": ep.positive(2.0)})
    table.print()  # with rich where installed, else plain text
    assert table.rows[0].bijector == "softplus"
    assert "<table>" in table._repr_html_()
    ```
    """

    def __init__(self, rows: list[Row]):
        self.rows = rows

    def _columns(self) -> list[str]:
        """The columns shown: those with an entry in some row (a table of a
        model without priors has no prior column, say), so it fits the page."""
        filled = lambda c: any(getattr(row, c) != "" for row in self.rows)  # noqa: E731
        return [c for c in _COLUMNS if filled(c) or not self.rows]

    def _cells(self) -> list[list[str]]:
        columns = self._columns()
        return [[str(getattr(row, c)) for c in columns] for row in self.rows]

    def __str__(self) -> str:
        cells = [self._columns(), *self._cells()]
        widths = [max(map(len, column)) for column in zip(*cells)]
        cells.insert(1, ["-" * w for w in widths])
        lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells)
        return "\n".join(line.rstrip() for line in lines)

    __repr__ = __str__

    def print(self) -> None:
        """Print the table: with `rich` where it is installed, else as text."""
        try:
            import rich
        except ImportError:
            print(self)
        else:
            rich.print(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self._columns())
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self._cells()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(*self._columns())
        for row in self._cells():
            table.add_row(*row)
        return table


def _distribution(prior: Any) -> str:
    """A prior as its class and numeric arguments, `Gamma(concentration=2,
    rate=1)`, wrapped or raw alike (a raw one's arguments as its family
    recovers them; its class alone where they cannot be recovered)."""
    if prior is None:
        return ""
    if isinstance(prior, FixedDistrax):
        cls, arguments = prior.cls, prior.arguments
    else:
        cls, family = type(prior), _families.family_of_instance(prior)
        try:
            arguments = {} if family is None else family.arguments_of(prior)
        except TypeError:
            arguments = {}
    numeric = lambda v: eqx.is_array(v) or type(v) in (int, float)  # noqa: E731
    shown = [f"{k}={_errors.display(v)}" for k, v in arguments.items() if numeric(v)]
    return f"{cls.__name__}({', '.join(shown)})" if shown else cls.__name__


def summary(model: PyTree, overrides: Any = None) -> Summary:
    """A table of the model's parameters: one row per array leaf or parameter node.

    Columns: `path` (argument names inside `FixedDistrax`, e.g.
    `likelihood.dist.scale`), `shape`, `dtype`, `value` (constrained; big arrays as
    mean and range), `constraint`, `bijector`, `prior` (class and numeric
    arguments, `Gamma(concentration=2, rate=1)`, raw or wrapped alike),
    `trainable`; a column empty in every row is left out. Works on raw
    models with `ep.field` metadata (the bijector is the one `ep.unconstrain`
    would use), on `ep.parameterize`d models and on models holding
    `FixedDistrax`, `ep.Bijector` and `ep.Frozen` nodes, and on GPJax 1.0 models
    (paramax wrappers: the constrained value under the parameter's own name,
    `NonTrainable` ones not trainable, as for `ep.trainable`). For an `ep.guide`,
    the rows are the model's, at the posterior's location mapped through each
    parameter's bijector (`guide.mean()`). Python numbers get a row
    too, with their type as dtype, not trainable (they are static). `print` it,
    or look at `.rows`.

    **Arguments:**

    - `model`: any PyTree.
    - `overrides`: optional `{where: ep.ParamSpec}`, as for `ep.spec_tree`.

    **Returns:**

    A `Summary`: its `rows`, printed as plain text, HTML in notebooks, `rich`
    where installed.

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    class Kernel(eqx.Module):
        lengthscale: jax.Array = ep.field(
            constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
        )
        variance: jax.Array = ep.field(constraint=ep.constraints.positive)

    table = ep.summary(ep.parameterize(Kernel(jnp.array(1.5), jnp.array(2.0))))
    print(table)
    assert table.rows[0].path == "lengthscale" and table.rows[0].value == "1.5"
    ```
    """
    if isinstance(model, _variational.Guide):  # the posterior, constrained
        model, overrides = model.mean(), model.overrides
    module = _node.paramax()  # GPJax 1.0's parameters are paramax wrappers
    wrapper = () if module is None else (module.AbstractUnwrappable,)
    frozen_wrapper = () if module is None else (module.NonTrainable,)
    is_item = lambda x: _parameter.is_node(x) or isinstance(x, wrapper)  # noqa: E731
    rows = []
    for path, spec, item in _metadata.entries(model, overrides, is_item)[0]:
        label, bijector = _metadata.label_of(path), ""
        # (Trainable as `ep.trainable` says, paramax's `NonTrainable` included.)
        trainable = any(jtu.tree_leaves(_parameter.trainable(item)))
        value = _parameter.resolve(item)  # (leaves resolve to themselves)
        if _parameter.is_node(item):
            inner = item.value if isinstance(item, _parameter.Frozen) else item
            if _parameter.is_bijector(inner):
                bijector = _transforms.describe(_parameter.resolve(inner.transform))
        elif isinstance(item, wrapper):  # its value under the parameter's name
            inner = item.tree if isinstance(item, frozen_wrapper) else item  # pyright: ignore[reportAttributeAccessIssue]
            bijector = type(inner).__name__ if isinstance(inner, wrapper) else ""
        elif eqx.is_array(item):
            trainable = trainable and (spec is None or spec.is_trainable)
            if _metadata.is_parameter_leaf(spec, label, item):
                bijector = _transforms.describe(spec.transform())
        elif not isinstance(item, (int, float, complex)):  # numbers: never trained
            continue  # other static leaves (strings, functions, ...)
        if not isinstance(value, (jax.core.Tracer, int, float, complex)):
            value = np.asarray(value)
        dtype = getattr(value, "dtype", type(value).__name__)
        shown = (str(tuple(np.shape(value))), str(dtype), _errors.display(value))
        constraint = getattr(spec, "constraint", None)
        constraint = "" if constraint is None else repr(constraint)
        constraint = constraint.removeprefix("constraints.")
        prior = _distribution(getattr(spec, "prior", None))
        rows.append(Row(label, *shown, constraint, bijector, prior, bool(trainable)))
    return Summary(rows)
