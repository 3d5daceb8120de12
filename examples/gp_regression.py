"""Exact GP regression with eqxprob: the flagship example (`make demo`).

An RBF kernel plus Gaussian noise, hyperparameters declared with `ep.field`
constraints, trained in unconstrained space with `ep.fit`; the negative log marginal
likelihood goes through a wrapped `distrax.MultivariateNormalTri`. Prints the fitted
hyperparameters and writes `gp_regression.png` (data, posterior mean, ±2σ band).

Run: `python examples/gp_regression.py [--steps N] [--n N] [--out FILE]`
"""

from __future__ import annotations

import argparse

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import optax
from jaxtyping import Array, Float
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


tfd = tfp.distributions

positive = ep.constraints.positive


def gamma(concentration: float, rate: float) -> ep.FixedDistrax:
    return ep.FixedDistrax(tfd.Gamma, jnp.array(concentration), jnp.array(rate))


# Priors are used by examples/map_with_priors.py and nuts_blackjax.py; maximum
# likelihood (this script) ignores them.
class RBF(eqx.Module):
    """k(x, x') = variance · exp(-|x - x'|² / (2 lengthscale²))."""

    lengthscale: Float[Array, ""] = ep.field(constraint=positive, prior=gamma(2, 1))
    variance: Float[Array, ""] = ep.field(constraint=positive, prior=gamma(2, 1))

    def __call__(self, x1: Float[Array, " n"], x2: Float[Array, " m"]) -> Array:
        sq = (x1[:, None] - x2[None, :]) ** 2
        return self.variance * jnp.exp(-0.5 * sq / self.lengthscale**2)


class ExactGP(eqx.Module):
    kernel: RBF
    # The observation-noise variance.
    noise: Float[Array, ""] = ep.field(constraint=positive, prior=gamma(1, 10))

    def cholesky(self, x: Float[Array, " n"]) -> Array:
        """The lower Cholesky factor of K + noise·I at x."""
        k = self.kernel(x, x) + self.noise * jnp.eye(x.shape[0], dtype=x.dtype)
        return jnp.linalg.cholesky(k)

    def marginal(self, x: Float[Array, " n"]) -> ep.FixedDistrax:
        """The prior predictive of y at x: N(0, K + noise·I), as a pytree."""
        return ep.FixedDistrax(
            distrax.MultivariateNormalTri, jnp.zeros_like(x), self.cholesky(x)
        )

    def nlml(self, x: Float[Array, " n"], y: Float[Array, " n"]) -> Array:
        """Negative log marginal likelihood."""
        return -self.marginal(x).log_prob(y)

    def predict(self, x: Array, y: Array, x_new: Array) -> tuple[Array, Array]:
        """Posterior predictive mean and variance of y at `x_new` (noise included)."""
        lower = self.cholesky(x)
        k_cross = self.kernel(x, x_new)
        alpha = jsl.cho_solve((lower, True), y)
        v = jsl.solve_triangular(lower, k_cross, lower=True)
        mean = k_cross.T @ alpha
        var = self.kernel.variance - jnp.sum(v**2, axis=0) + self.noise
        return mean, var


def make_data(n: int = 200, seed: int = 0) -> tuple[Array, Array]:
    """x = linspace(0, 10, n), y = sin(x) + 0.1·noise."""
    x = jnp.linspace(0.0, 10.0, n)
    y = jnp.sin(x) + 0.1 * jax.random.normal(jax.random.PRNGKey(seed), (n,))
    return x, y


# Name and getter of each hyperparameter, for the tables the examples print.
HYPERPARAMETERS = {
    "kernel.lengthscale": lambda gp: gp.kernel.lengthscale,
    "kernel.variance": lambda gp: gp.kernel.variance,
    "noise (variance)": lambda gp: gp.noise,
}


def initial_model() -> ExactGP:
    return ExactGP(
        RBF(lengthscale=jnp.array(1.0), variance=jnp.array(1.0)), noise=jnp.array(0.5)
    )


def train(
    x: Array, y: Array, steps: int = 500, progress: bool = True
) -> tuple[ExactGP, Array]:
    """Fit the hyperparameters by maximising the marginal likelihood."""
    params = ep.parameterize(initial_model())  # positive fields become ep.Bijectors
    params, losses = ep.fit(
        params,
        lambda p: ep.resolve(p).nlml(x, y),
        optimiser=optax.adam(0.01),
        steps=steps,
        progress=progress,
    )
    return ep.resolve(params), losses


def plot(gp: ExactGP, x: Array, y: Array, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_new = jnp.linspace(-1.0, 11.0, 300)
    mean, var = gp.predict(x, y, x_new)
    band = 2 * jnp.sqrt(var)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.plot(x, y, ".", color="0.4", markersize=4, label="data")
    ax.plot(x_new, mean, color="C0", label="posterior mean")
    ax.fill_between(
        x_new,
        mean - band,
        mean + band,
        color="C0",
        alpha=0.2,
        label="±2σ posterior predictive of y (latent f + noise)",
    )
    ax.plot(x_new, jnp.sin(x_new), "--", color="C1", linewidth=1, label="sin(x)")
    ax.set(xlabel="x", ylabel="y", title="Exact GP regression with eqxprob")
    # Below the axes, so that it never covers the data.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    steps: int = 500, n: int = 200, out: str = "gp_regression.png", progress=True
) -> tuple[ExactGP, Array]:
    with jax.enable_x64(True):
        x, y = make_data(n)
        gp, losses = train(x, y, steps=steps, progress=progress)
        print(f"Exact GP, RBF + noise, n = {n}, {steps} steps of adam(0.01), float64")
        print("fitted hyperparameters (ep.summary):")
        print(ep.summary(gp))
        print(f"NLML: {float(losses[0]):.4f} -> {float(gp.nlml(x, y)):.4f}")
        plot(gp, x, y, out)
        print(f"wrote {out}")
    return gp, losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out", default="gp_regression.png")
    args = parser.parse_args()
    main(steps=args.steps, n=args.n, out=args.out)
