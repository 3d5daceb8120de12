"""Smoke test of eqxprob's core, run by `make smoke-lowest` against the lowest
versions of the direct dependencies that pyproject.toml allows.

It proves the declared floors: each check below exercises one part of the core
(wrappers, constrained parameters, the metadata registry, `ep.fit`, variational
inference) quickly, with assertions on the numbers, not only on imports.
"""

import importlib.metadata as md
import sys
import time


start = time.perf_counter()

PACKAGES = [
    "jax", "jaxlib", "equinox", "distrax", "optax", "jaxtyping", "tqdm",
    "tfp-nightly", "chex", "numpy", "wadler-lindig", "numpyro",
]  # fmt: skip
print(f"python {sys.version.split()[0]}")
for name in PACKAGES:
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")

import distrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from tensorflow_probability.substrates import jax as tfp  # noqa: E402

import eqxprob as ep  # noqa: E402


print(f"eqxprob {ep.__version__} from {ep.__file__}")
# One source for the version: hatch reads it from eqxprob/__init__.py.
assert md.version("eqxprob") == ep.__version__, (md.version("eqxprob"), ep.__version__)

# 1. FixedDistrax under eqx.filter_grad: gradients w.r.t. loc and scale.
dist = ep.FixedDistrax(distrax.Normal, loc=jnp.array(0.5), scale=jnp.array(2.0))
x = jnp.array(1.5)
grads = eqx.filter_grad(lambda d: d.log_prob(x))(dist)
# d/dloc log N(x; loc, s) = (x - loc) / s^2; d/ds = ((x - loc)^2 - s^2) / s^3
assert jnp.allclose(grads.loc, 0.25), grads.loc
assert jnp.allclose(grads.scale, (1.0 - 4.0) / 8.0), grads.scale
# ... and nested: a distrax Transformed of a wrapped Normal by a TFP-JAX bijector.
nested = ep.FixedDistrax(distrax.Transformed, dist, ep.FixedDistrax(tfp.bijectors.Exp))
g = eqx.filter_grad(lambda d: d.log_prob(jnp.exp(x)))(nested)
assert jnp.allclose(g.distribution.loc, grads.loc), g.distribution.loc
print("ok FixedDistrax + eqx.filter_grad (distrax, TFP-JAX)")

# 2. ep.positive + ep.resolve.
scale = ep.positive(2.0)
assert jnp.allclose(ep.resolve(scale), 2.0)
model = {"scale": scale, "shift": jnp.array(1.0)}
values = ep.resolve(model)
assert jnp.allclose(values["scale"], 2.0) and values["shift"] == 1.0
print("ok ep.positive + ep.resolve")


# 3. ep.unconstrain / ep.constrain on a module with ep.field(constraint=...).
class Noise(eqx.Module):
    scale: jax.Array = ep.field(constraint=ep.constraints.positive)


raw = ep.unconstrain(Noise(jnp.array(2.0)))
assert not jnp.allclose(raw.scale, 2.0)  # inverse softplus
assert jnp.allclose(ep.constrain(raw).scale, 2.0)
g = eqx.filter_grad(lambda r: ep.constrain(r).scale)(raw)
assert jnp.allclose(g.scale, 1 - jnp.exp(-2.0))  # sigmoid(softplus^-1(2))
print("ok ep.unconstrain / ep.constrain")

# 4. A 20-step ep.fit, with its tqdm progress bar (on stderr).
data = jnp.array([1.0, 2.0, 4.0])
fitted, losses = ep.fit(
    ep.positive(1.0),
    lambda s: jnp.sum((ep.resolve(s) - data) ** 2),
    optimiser=optax.adam(0.1),
    steps=20,
    progress=True,
)
assert losses.shape == (20,) and bool(jnp.all(jnp.isfinite(losses)))
assert losses[-1] < losses[0], losses
print(f"ok ep.fit: loss {float(losses[0]):.3f} -> {float(losses[-1]):.3f}")


# 5. ep.guide + ep.elbo, trained for a few steps with ep.fit.
class Mean(eqx.Module):
    mu: jax.Array = ep.field(prior=distrax.Normal(0.0, 10.0))


y = jnp.array([0.9, 1.4, 1.1])


def loss(q, key):
    loglik = lambda m: jnp.sum(distrax.Normal(m.mu, 1.0).log_prob(y))
    return -ep.elbo(q, loglik, key, num_samples=4)


q = ep.guide(Mean(jnp.array(0.0)))
value = ep.elbo(q, lambda m: jnp.sum(distrax.Normal(m.mu, 1.0).log_prob(y)),
                jax.random.key(0))  # fmt: skip
assert value.shape == () and jnp.isfinite(value)
q, losses = ep.fit(
    q, loss, optimiser=optax.adam(0.1), steps=20, key=jax.random.key(0), progress=False
)
assert bool(jnp.all(jnp.isfinite(losses))) and q.loc[0] > 0.5, q.loc
print(f"ok ep.guide + ep.elbo: loc {float(q.loc[0]):.3f}")


# 6. The optional numpyro family at its declared floor (the `numpyro` extra).
import numpyro.distributions as nd  # noqa: E402


normal = ep.FixedDistrax(nd.Normal, jnp.array([0.0, 1.0]), jnp.array(2.0))
g = eqx.filter_grad(lambda d: d.log_prob(jnp.array(1.5)).sum())(normal)
assert jnp.allclose(g.loc, jnp.array([1.5, 0.5]) / 4.0), g.loc
affine = ep.FixedDistrax(nd.transforms.AffineTransform, jnp.array(1.0), jnp.array(2.0))
assert jnp.allclose(affine.forward(jnp.array(1.0)), 3.0)
print("ok FixedDistrax + eqx.filter_grad (numpyro)")
from numpyro.distributions.kl import kl_divergence  # noqa: E402


other = ep.FixedDistrax(nd.Normal, jnp.array([1.0, 0.0]), jnp.array([1.0, 3.0]))
raw_kl = kl_divergence(normal.instantiate(), other.instantiate())
assert jnp.allclose(kl_divergence(normal, other), raw_kl)
assert normal.scale is normal.arguments["scale"]  # a field is its argument
assert normal.scale.shape == () and normal.instantiate().scale.shape == (1,)
assert jnp.allclose(normal.mean, normal.instantiate().mean)  # numpyro's: a value
print("ok numpyro's kl_divergence takes wrappers; a field is its argument")

print(f"smoke passed in {time.perf_counter() - start:.1f}s")
