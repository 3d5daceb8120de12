"""The SVGP example's maths written by hand: the independent reference that
`tests/test_examples.py` and the benchmarks (`benchmarks/peers.py`, `svgp.py`)
compare the example with. Negative minibatch ELBO of a whitened SVGP (RBF
kernel, probit link squeezed into [1e-3, 1 - 1e-3] as GPJax 1.0's `Bernoulli`,
Gauss-Hermite quadrature) over a dict of unconstrained arrays (softplus for
positive values, `ep.lower_cholesky`'s row-major lower triangle)."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def params(z: jax.Array) -> dict:
    """The unconstrained start of `SVGP.init(z)`: lengthscale and variance 1,
    q(v) = N(0, I)."""
    m = z.shape[0]
    one = jnp.log(jnp.expm1(jnp.ones((), z.dtype)))  # softplus⁻¹(1)
    r, c = np.tril_indices(m)
    return {
        "ls": one, "var": one, "z": z, "m": jnp.zeros(m, z.dtype),
        "tril": jnp.where(r == c, one, jnp.zeros((), z.dtype)),
    }  # fmt: skip


def loss(m: int, rows: int, t: np.ndarray, w: np.ndarray, jitter: float = 1e-6
         ) -> Callable:  # fmt: skip
    """`loss(p, x, y)`: the negative ELBO of the batch `(x, y)` scaled to `rows`
    rows, with `m` inducing points and quadrature nodes `t`, weights `w`."""
    r, c = np.tril_indices(m)

    def negative_elbo(p, x, y):
        ls, var = jax.nn.softplus(p["ls"]), jax.nn.softplus(p["var"])
        lq = (
            jnp.zeros((m, m))
            .at[r, c]
            .set(jnp.where(r == c, jax.nn.softplus(p["tril"]), p["tril"]))
        )

        def k(a, b):
            a, b = a / ls, b / ls
            return var * jnp.exp(-0.5 * jnp.sum((a[:, None] - b[None]) ** 2, -1))

        lz = jnp.linalg.cholesky(k(p["z"], p["z"]) + jitter * jnp.eye(m))
        a = jax.scipy.linalg.solve_triangular(lz, k(p["z"], x), lower=True)
        v = var - jnp.sum(a**2, 0) + jnp.sum((lq.T @ a) ** 2, 0)
        f = (a.T @ p["m"])[:, None] + jnp.sqrt(2 * jnp.maximum(v, 1e-12))[:, None] * t
        prob = 0.5 * (1 + jax.scipy.special.erf(f / np.sqrt(2))) * (1 - 2e-3) + 1e-3
        logp = jnp.where(y[:, None] > 0.5, jnp.log(prob), jnp.log1p(-prob))
        log_det = jnp.sum(jnp.log(jnp.diag(lq)))
        kl = 0.5 * (p["m"] @ p["m"] + jnp.sum(lq**2) - m) - log_det
        return -(rows / x.shape[0] * jnp.sum(logp @ w) - kl)

    return negative_elbo
