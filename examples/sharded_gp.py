"""The GP negative log marginal likelihood with data and kernel rows sharded.

eqxprob scales past one device with JAX's own SPMD: put the data on a device mesh
with `NamedSharding`, replicate the model (a PyTree holding `ep.Bijector` and
`ep.FixedDistrax` nodes goes through `eqx.filter_shard` / `jax.device_put` like any
other), and let `jit` partition the computation. On a CPU, fake 8 devices:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/sharded_gp.py

Prints the sharded and single-device NLML and gradients, which agree to 1e-8.
"""

from __future__ import annotations

import os


os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from gp_regression import initial_model, make_data  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import eqxprob as ep  # noqa: E402


def nlml(params, x, y):
    # The model's own NLML, through a wrapped `distrax.MultivariateNormalTri`.
    return ep.resolve(params).nlml(x, y)


def main(n: int = 256) -> tuple[float, float]:
    with jax.enable_x64(True):
        mesh = Mesh(np.array(jax.devices()), ("data",))
        x, y = make_data(n)
        params = ep.parameterize(initial_model())
        value_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(nlml))

        # Single device: everything on the first device.
        single, single_grad = value_and_grad(params, x, y)

        # Sharded: rows of the data across the mesh, the model replicated.
        rows = NamedSharding(mesh, P("data"))
        replicated = NamedSharding(mesh, P())
        x_sharded, y_sharded = jax.device_put((x, y), rows)
        params_sharded = eqx.filter_shard(params, replicated)
        assert jax.tree_util.tree_structure(
            params_sharded
        ) == jax.tree_util.tree_structure(params)
        sharded, sharded_grad = value_and_grad(params_sharded, x_sharded, y_sharded)

        grads = zip(
            jax.tree_util.tree_leaves(single_grad),
            jax.tree_util.tree_leaves(sharded_grad),
        )
        grad_diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in grads)
        print(f"devices: {len(jax.devices())}, x sharded as {x_sharded.sharding.spec}")
        print(f"NLML single device : {float(single):.12f}")
        print(f"NLML sharded       : {float(sharded):.12f}")
        print(
            f"|difference| = {abs(float(single) - float(sharded)):.2e}, "
            f"max |gradient difference| = {grad_diff:.2e}"
        )
    return float(single), float(sharded)


if __name__ == "__main__":
    main()
