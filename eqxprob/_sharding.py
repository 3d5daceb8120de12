"""Sharding for `fit` under meshes with `Explicit` axes (`jax.make_mesh`'s default).

Under such a mesh a sharding is part of an array's type, so what `fit` puts
beside the user's arrays must be typed to match: a parameter made with
`jnp.zeros` (on no mesh) meets data sharded over one, and the gradient of a
contraction over the sharded rows needs both typed; and a minibatch is gathered
sharded as its data where the batch splits evenly over the shards of the row
axis (data parallel), its rows replicated otherwise. Elsewhere (one device,
`jax.distributed` processes with automatic axes) both are the identity or plain
indexing.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from jaxtyping import Array


def _concrete(x: Any) -> bool:
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def _mesh(x: Any) -> Any:
    """The mesh `x` is typed with if it has `Explicit` axes, else `None` (the
    concrete mesh of a concrete array, the abstract one of a tracer)."""
    mesh = getattr(x.sharding if _concrete(x) else jax.typeof(x).sharding, "mesh", None)
    return mesh if mesh is not None and AxisType.Explicit in mesh.axis_types else None


def place_together(tree: Any) -> Any:
    """`tree` with its concrete arrays on no mesh replicated over the
    `Explicit` mesh the first of its other concrete arrays is typed with."""
    leaves, treedef = jax.tree.flatten(tree)
    mesh = next(filter(None, map(_mesh, filter(_concrete, leaves))), None)
    if mesh is None:
        return tree
    where = NamedSharding(mesh, PartitionSpec())
    for i, x in enumerate(leaves):
        if _concrete(x) and not x.committed:
            # (A key through its data: a sharding over the devices of several
            # processes takes an array the same on each process, not a key.)
            if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
                data = jax.device_put(jax.random.key_data(x), where)
                leaves[i] = jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
            else:
                leaves[i] = jax.device_put(x, where)
    return treedef.unflatten(leaves)


def rows(data: Array, index: Array) -> Array:
    """The rows `index` of `data`, typed as the module says."""
    mesh = _mesh(data)
    if mesh is None:
        return data[index]
    spec = jax.typeof(data).sharding.spec
    spec = [*spec, *[None] * (data.ndim - len(spec))]
    names = () if spec[0] is None else np.atleast_1d(spec[0]).tolist()
    if index.shape[0] % np.prod([mesh.shape[n] for n in names], dtype=int):
        spec[0] = None
    return data.at[index].get(out_sharding=NamedSharding(mesh, PartitionSpec(*spec)))
