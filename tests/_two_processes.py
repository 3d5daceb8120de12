"""One process of a multi-process run (`jax.distributed` on localhost, CPU devices
joined by gloo), for tests/test_processes.py: `python _two_processes.py INDEX COUNT
PORT MODE`. The global mesh always has 4 devices (4 // COUNT per process), and each
process holds only its share of the 64 rows. It prints one JSON line of results.

Modes: `check` (shard shapes, the ELBO's gradient, a minibatch fit, a fit that
goes non-finite, a fit with progress shown) and `die` (process 1 exits during a
long fit; process 0 must fail).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import jax


index, count, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_num_cpu_devices", 4 // count)
if count > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", count, index, heartbeat_timeout_seconds=5
    )

import distrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import eqxprob as ep  # noqa: E402


ROWS = 64


class Logistic(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))
    scale: jax.Array = ep.field(
        constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
    )


# The same rows on every process (from one seed); each keeps only its share.
rng = np.random.default_rng(0)
x_all = rng.normal(size=(ROWS, 3))
y_all = (x_all @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=ROWS) > 0) * 1.0
mine = slice(index * ROWS // count, (index + 1) * ROWS // count)
auto = (jax.sharding.AxisType.Auto,)  # (XLA places the contractions over rows)
mesh = jax.make_mesh((jax.device_count(),), ("rows",), axis_types=auto)
by_rows = NamedSharding(mesh, PartitionSpec("rows"))
x = jax.make_array_from_process_local_data(by_rows, x_all[mine])
y = jax.make_array_from_process_local_data(by_rows, y_all[mine])
out: dict = {"index": index}


def leaves(tree):
    return [
        np.asarray(a).tolist() for a in jax.tree.leaves(eqx.filter(tree, eqx.is_array))
    ]


def log_likelihood(batch):
    xb, yb = batch
    return lambda m: jnp.sum(
        distrax.Bernoulli(logits=(xb @ m.w) / m.scale).log_prob(yb)
    )


def loss(q, batch, key):
    scale = ROWS / batch[1].shape[0]
    return -ep.elbo(
        q, log_likelihood(batch), key, num_samples=4, likelihood_scale=scale
    )


q0 = ep.guide(Logistic(jnp.zeros(3), jnp.array(1.0)))

if mode == "die":
    if index == 1:
        threading.Timer(3.0, os._exit, (3,)).start()
    ep.fit(
        q0,
        loss,
        optimiser=optax.adam(1e-2),
        steps=10**8,
        data=(x, y),
        batch_size=8,
        key=jax.random.key(1),
        progress=False,
    )
    sys.exit("the fit ended")

# Each process's memory holds only its own rows: its devices' shards.
out["shards"] = [
    [s.data.shape, np.asarray(s.data).tolist() == x_all[s.index].tolist()]
    for s in x.addressable_shards
]
out["own_rows"] = (
    sorted({r for s in x.addressable_shards for r in range(ROWS)[s.index[0]]})
    == list(range(ROWS))[mine]
)

grad = eqx.filter_jit(eqx.filter_grad(loss))(q0, (x, y), jax.random.key(2))
out["grad"] = leaves(grad)

q, losses = ep.fit(
    q0,
    loss,
    optimiser=optax.adam(5e-2),
    steps=400,
    data=(x, y),
    batch_size=16,
    key=jax.random.key(3),
    progress=False,
)
out["fit"] = leaves(q)
out["losses"] = np.asarray(losses).tolist()

# Under a mesh with `Explicit` axes (batches taken with `out_sharding`).
explicit = jax.make_mesh(
    (jax.device_count(),), ("rows",), axis_types=(jax.sharding.AxisType.Explicit,)
)
column = jax.make_array_from_process_local_data(
    NamedSharding(explicit, PartitionSpec("rows")), x_all[mine, 0]
)
square = lambda m, b: jnp.mean((b - m) ** 2)
m, _ = ep.fit(
    jnp.zeros(()),
    square,
    optimiser=optax.adam(0.1),
    steps=20,
    data=column,
    batch_size=8,
    key=jax.random.key(5),
    progress=False,
)
out["explicit"] = float(m)

try:  # log(-1) at step 1 (sgd from 1.0 with gradient 1), on every process
    bad = lambda m, b: jnp.log(m) * jnp.mean(b[1] * 0.0 + 1.0)
    ep.fit(
        jnp.array(1.0),
        bad,
        optimiser=optax.sgd(2.0),
        steps=10,
        data=(x, y),
        progress=False,
    )
    out["non_finite"] = None
except ep.NonFiniteLossError as e:
    out["non_finite"] = [e.step, float(e.model)]

ep.fit(
    q0,
    loss,
    optimiser=optax.adam(5e-2),
    steps=7,
    data=(x, y),
    batch_size=16,
    key=jax.random.key(3),
    progress=True,
)
print(json.dumps(out), flush=True)
