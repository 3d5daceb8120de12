"""Whether a library keeps a constructor argument as given: the rule behind a
wrapper's attribute of an argument's name.

`d.probs` on a wrapper could mean the argument or the library's attribute, which
differ where the library computes its attribute from the argument (distrax's
`Categorical` normalises `probs`; `MultivariateNormalTri` keeps the lower
triangle of `scale_tri`) or broadcasts it to the batch shape. `differs` decides
from the traced program of "build the object, read its attribute", never from
the Python objects: the attribute is the argument as given when it is that
argument alone, of the same shape, through moves and dtype conversions
(`broadcast_in_dim`, `reshape`, `convert_element_type`, ..., also inside nested
`jit`s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend.core as jex


# Primitives that move or retype an array without computing new values.
_STRUCTURAL = frozenset({
    "broadcast_in_dim", "reshape", "convert_element_type", "squeeze",
    "expand_dims", "copy", "copy_p",
})  # fmt: skip
_CALLS = ("pjit", "jit", "closed_call", "core_call")


def differs(attribute: Callable[[list], Any], leaves: list, index: int) -> str | None:
    """How `attribute(leaves)` (build an object from `leaves`, read one of its
    attributes) differs from `leaves[index]`, in words, or `None` where it is
    that argument up to a dtype conversion (or the object has no such array
    attribute: nothing to disagree with). Exceptions of `attribute` propagate."""
    found: list[bool] = []

    def read(*xs: Any) -> Any:
        value = attribute(list(xs))
        found.append(eqx.is_array(value))
        return value if found[-1] else ()

    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    closed = jax.make_jaxpr(read)(*avals)
    if not found[-1]:
        return None
    out = closed.jaxpr.outvars[0]
    if _source(closed.jaxpr, out) != index:
        return "computed from the arguments"
    if out.aval.shape != tuple(leaves[index].shape):
        return f"the argument broadcast or reshaped to {out.aval.shape}"
    return None


def _source(jaxpr: Any, var: Any) -> int | None:
    """The index of the input of `jaxpr` that `var` moves or retypes, or `None`."""
    producers = {out: eqn for eqn in jaxpr.eqns for out in eqn.outvars}
    while not isinstance(var, jex.Literal):
        if var in jaxpr.invars:
            return jaxpr.invars.index(var)
        eqn = producers.get(var)
        if eqn is None:
            return None
        if eqn.primitive.name in _STRUCTURAL:
            var = eqn.invars[0]
        elif eqn.primitive.name in _CALLS:
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            inner = getattr(inner, "jaxpr", inner)
            position = _source(inner, inner.outvars[eqn.outvars.index(var)])
            if position is None:
                return None
            var = eqn.invars[position]
        else:
            return None
    return None
