"""Static values in PyTrees: compared and hashed by what they are, type included.

A static field (a wrapper's non-array arguments, a transform without arrays) is part
of a tree's structure, so two trees share a compiled program exactly when their
static values are equal. `float_key` says when that is: by value *and* type, so `1`,
`1.0` and `True` differ, and so do `0.0` and `-0.0`.
"""

from __future__ import annotations

import math
from typing import Any

import jax.tree_util as jtu

from ._families import is_raw


def float_key(value: Any) -> Any:
    """A hashable key that tells apart what `==` confuses: `1`, `1.0`, `True`,
    `0.0` and `-0.0`; NaN equals NaN. A raw library object (a distrax bijector
    held as a transform) is keyed by its class and attributes (unhashable if it
    holds arrays)."""
    if type(value) is float:
        return (float, value.hex() if not math.isnan(value) else "nan")
    if type(value) in (tuple, list):
        return (type(value), tuple(map(float_key, value)))
    if type(value) is dict:
        return (dict, tuple((k, float_key(v)) for k, v in value.items()))
    if is_raw(value):
        return (type(value), float_key(vars(value)))
    return (type(value), value)


class Const:
    """A value compared and hashed by `key` (default `float_key(value)`), as a
    static field needs: a static value inside a dynamic argument (e.g. a callable
    in a list of wrappers), a static transform.

    A pytree node without children whose auxiliary data is itself, so it never
    becomes a leaf.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any, key: Any = None):
        self.value = value
        self._key = float_key(value) if key is None else key

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key == other._key  # pyright: ignore[reportAttributeAccessIssue]

    def __repr__(self) -> str:
        return repr(self.value)


jtu.register_pytree_node(Const, lambda c: ((), c), lambda c, _: c)
