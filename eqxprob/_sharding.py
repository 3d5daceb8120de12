"""Sharding for `fit` under meshes with `Explicit` axes (`jax.make_mesh`'s default).

Under such a mesh a sharding is part of an array's type, so what `fit` makes
itself must be typed to match what it meets: the losses' buffer (replicated), a
minibatch (sharded as its data, or its rows replicated) and an optimiser state
from elsewhere (placed as the optimiser's `init` places a fresh one). Outside
such meshes every function here is the identity or plain indexing.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array


def explicit_mesh(x: Any) -> Any:
    """The mesh `x` is typed with if it has `Explicit` axes, else `None`."""
    sharding = jax.typeof(x).sharding if isinstance(x, jax.core.Tracer) else None
    if sharding is None:
        sharding = getattr(x, "sharding", None)
    if type(sharding) is jax.sharding.NamedSharding and (
        jax.sharding.AxisType.Explicit in sharding.mesh.axis_types
    ):
        return sharding.mesh
    return None


def first_mesh(leaves: list) -> Any:
    """The `Explicit` mesh of the first of `leaves` typed with one, or `None`."""
    return next(filter(None, map(explicit_mesh, leaves)), None)


def named(mesh: Any, spec: list) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def zeros(n: int, dtype: Any, mesh: Any) -> Array:
    """A buffer of `n` zeros, typed replicated over `mesh` if there is one."""
    return jnp.zeros((n,), dtype, device=None if mesh is None else named(mesh, []))


def rows(data: Array, index: Array) -> Array:
    """The rows `index` of `data`: sharded as the data if the batch splits
    evenly over the shards of the row axis (data parallel), its rows replicated
    otherwise (the other axes as the data's)."""
    mesh = explicit_mesh(data)
    if mesh is None:
        return data[index]
    spec = jax.typeof(data).sharding.spec
    spec = [*spec, *[None] * (data.ndim - len(spec))]
    row = spec[0]
    names = () if row is None else (row,) if isinstance(row, str) else tuple(row)
    if index.shape[0] % np.prod([mesh.shape[n] for n in names], dtype=int):
        spec[0] = None
    return data.at[index].get(out_sharding=named(mesh, spec))


def place_like(leaves: list, like: list) -> list:
    """`leaves` moved to the shardings of `like` (a fresh optimiser state) where
    those are `Explicit`-mesh shardings and differ; tracers stay as they are."""

    def place(x: Any, y: Any) -> Any:
        if isinstance(x, jax.core.Tracer) or explicit_mesh(y) is None:
            return x
        same = getattr(x, "sharding", None) == y.sharding
        return x if same else jax.device_put(x, y.sharding)

    return [place(x, y) for x, y in zip(leaves, like)]


def place_together(tree: Any) -> Any:
    """`tree` with its uncommitted arrays committed where its first committed
    one is (replicated over its mesh), if it has both kinds: a parameter made
    with `jnp.zeros` meets data sharded over a mesh, and under `Explicit` axes
    their types must agree (the gradient of a contraction over the sharded
    rows, say)."""
    leaves, treedef = jax.tree.flatten(tree)
    arrays = [(i, x) for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    concrete = [i for i, x in arrays if not isinstance(x, jax.core.Tracer)]
    committed = [leaves[i].sharding for i in concrete if leaves[i].committed]
    loose = [i for i in concrete if not leaves[i].committed]
    if not committed or not loose:
        return tree
    sharding = committed[0]
    if isinstance(sharding, jax.sharding.NamedSharding):
        sharding = named(sharding.mesh, [])
    elif not isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return tree
    for i in loose:
        leaves[i] = _put(leaves[i], sharding)
    return jax.tree.unflatten(treedef, leaves)


def _put(x: Array, sharding: Any) -> Array:
    """`jax.device_put(x, sharding)`, typed PRNG keys included: a sharding over
    the devices of several processes (`jax.distributed`) takes an uncommitted
    array, the same on each process, but not a key."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jax.device_put(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return jax.device_put(x, sharding)
