"""Nodes: PyTree objects that stand for a value computed from their own leaves.

A `Node` says how to compute its value in one abstract method, `unwrap`, as
paramax's `AbstractUnwrappable` does; `resolve` replaces every node of a tree by its
value, innermost first. paramax's own wrappers (GPJax 1.0's parameters among them)
resolve too, through `paramax.unwrap`, if the user has imported paramax.
"""

from __future__ import annotations

import abc
import sys
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import PyTree


class Node(eqx.Module):
    """A PyTree node that `resolve` replaces by `unwrap()`."""

    @abc.abstractmethod
    def unwrap(self) -> Any:
        """The value the node stands for (resolving any node among its fields)."""


def is_node(x: Any) -> bool:
    return isinstance(x, Node)


def paramax() -> Any:
    """paramax, if imported (GPJax 1.0 imports it); public paramax API only."""
    return sys.modules.get("paramax")


def resolve(tree: PyTree) -> PyTree:
    """`tree` with every `Node` (and paramax wrapper) replaced by its value."""
    module = paramax()
    kinds = (Node,) if module is None else (Node, module.AbstractUnwrappable)

    def value(x: Any) -> Any:
        if isinstance(x, Node):
            return x.unwrap()
        if module is not None and isinstance(x, kinds):  # paramax: ours inside first
            inside = lambda y: y is not x and isinstance(y, kinds)  # noqa: E731
            return module.unwrap(jtu.tree_map(value, x, is_leaf=inside))
        return x

    return jtu.tree_map(value, tree, is_leaf=lambda x: isinstance(x, kinds))
