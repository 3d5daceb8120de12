"""Fit a wrapped distrax distribution to data with `eqx.filter_grad` + optax.

Raw distrax objects cannot go through `eqx.filter_grad` (their pytree metadata is
unequal across calls); the `FixedDistrax` wrapper can, and its leaves are exactly
the constructor's arrays, so the optimiser sees `loc` and `scale_tri` and nothing else.

Run: `python examples/fit_distribution.py`
"""

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxprob as ep


def main(steps: int = 500, n: int = 2_000, seed: int = 0) -> ep.FixedDistrax:
    true_mean = jnp.array([1.0, -2.0])
    true_tril = jnp.array([[1.0, 0.0], [0.6, 0.5]])
    data = true_mean + jax.random.normal(jax.random.PRNGKey(seed), (n, 2)) @ true_tril.T

    model = ep.FixedDistrax(
        distrax.MultivariateNormalTri, loc=jnp.zeros(2), scale_tri=jnp.eye(2)
    )
    optimiser = optax.adam(0.05)
    opt_state = optimiser.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, opt_state):
        loss, grads = eqx.filter_value_and_grad(lambda m: -jnp.mean(m.log_prob(data)))(
            model
        )
        updates, opt_state = optimiser.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, loss

    for _ in range(steps):
        model, opt_state, loss = step(model, opt_state)

    print(f"fitted {model}")
    print(f"  negative log-likelihood per point: {float(loss):.4f}")
    print(f"  loc       = {model.loc}   (sample mean {data.mean(0)})")
    print(f"  scale_tri = {model.instantiate().scale_tri.tolist()}")
    print(f"  covariance  {model.covariance().tolist()}")
    print(f"  sample cov  {jnp.cov(data.T).tolist()}")
    return model


if __name__ == "__main__":
    main()
