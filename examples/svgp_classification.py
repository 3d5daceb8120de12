"""Sparse variational GP classification (SVGP) with a Bernoulli likelihood.

Whitened inducing variables: u = L_z v with K_zz = L_z L_zᵀ, the prior p(v) = N(0, I)
a wrapped `distrax.MultivariateNormalDiag` and the posterior q(v) = N(m, L Lᵀ) a
wrapped `distrax.MultivariateNormalTri` (`L` an `ep.lower_cholesky` node, so it stays
triangular with a positive diagonal); the KL term is the wrapper's analytic
`kl_divergence`, which against a diagonal prior solves no triangular system: the step
compiles to what the same maths written by hand does (`tests/test_examples.py`). RBF
hyperparameters are `ep.field(constraint=positive)` fields turned into `ep.Bijector`s
by `ep.parameterize`; the inducing inputs train too. The likelihood is
`ep.FixedDistrax(distrax.Bernoulli, logits=f)`, its expectation under q(f) by 20-point
Gauss–Hermite quadrature (or Monte Carlo with `--mc`), minibatched through `ep.fit`
(rows drawn with replacement, so `(N / B) Σ_batch E[log p] - KL` is an unbiased ELBO).
Float64 throughout.

**Adam or natural gradients (`--natgrad [RATE]`).** By default adam trains every
parameter. With `--natgrad`, q(v) takes natural-gradient steps instead
(`ep.natural_gradient(RATE, optax.adam(0.01))`, RATE 0.1 by default: the usual
choice with minibatches and a non-Gaussian likelihood) and adam trains the kernel
and the inducing inputs, each step at the updated q(v), as GPJax's `fit_natgrads`.
Use natural gradients when q(v) is what is slow to fit: many inducing points, a
full-rank q, a budget of steps (on the default problem they reach in 20 steps a
better ELBO than adam's after 200, though each step costs more: one more gradient
and M × M factorisations). Use adam alone when a step must be as cheap as
possible and there are steps to spare, when q(v) is small, or with a rate of 1 on
a non-Gaussian likelihood, which overshoots (rate 1 is exact in one step only
for a Gaussian likelihood on the full batch); see
`docs/howto/natural_gradients.md`.

The data: x uniform on [-3, 3]², y ~ Bernoulli(σ(g(x))) with the known latent
g(x) = 6 sin(x₀) cos(x₁), so the Bayes classifier (sign of g) is printed as the
reference accuracy.

Run:

    python examples/svgp_classification.py [--n N] [--m M] [--steps S] [--batch B]
        [--mc] [--natgrad [RATE]] [--devices D] [--processes P] [--out FILE]
    python examples/svgp_classification.py --n 1000000 --m 128 --batch 1024 \\
        --steps 300 --out none                      # the 1M-point run
    python examples/svgp_classification.py --devices 8   # sharded vs single device
    python examples/svgp_classification.py --processes 2 # 2 processes vs 1

It prints the fitted hyperparameters, the ELBO at the first and last steps, the time
per compiled step, the peak memory of the process, held-out accuracy and NLPD (next
to the Bayes classifier's), and writes `svgp.png` (predictive probability surface
with the inducing points, and the ELBO trace). With `--devices D > 1` it asks XLA
for `D` host devices, trains once on one device and once with the data sharded along
its rows (model replicated), with the same key and so the same minibatches, and
prints the largest difference between the two final models and ELBO traces, and
between the two gradients at the initial model. The gradients agree to rounding
(~1e-16 relative); the trajectories agree to ~1e-7 on the default problem, but on
large ones (1M points, M = 128) they part after some 50 steps: the batch sums are
added in another order on 8 devices, and adam, whose steps are ~lr whatever the size
of a gradient entry, amplifies that rounding in the parameters whose gradients are
~0. With `--processes P > 1` it also launches `P` local processes
(`jax.distributed`, CPU devices joined by gloo, coordinator on 127.0.0.1), each
holding only its `n / P` rows, trains with the same key, and prints their time per
step and their largest difference from the one-process run.
"""

from __future__ import annotations

import os
import sys


def _requested_devices(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        if arg == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--devices="):
            return int(arg.split("=", 1)[1])
    return 1


# XLA reads its flags once, when JAX starts: fake the host devices before that.
if __name__ == "__main__" and _requested_devices(sys.argv) > 1:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={_requested_devices(sys.argv)}"
    )

import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import distrax  # noqa: E402
import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from jaxtyping import Array, Float, PRNGKeyArray  # noqa: E402

import eqxprob as ep  # noqa: E402


positive = ep.constraints.positive

# Gauss–Hermite nodes and weights for ∫ h(t) exp(-t²) dt; E[h(f)] for
# f ~ N(μ, σ²) is Σ_i w_i h(μ + √2 σ t_i) / √π.
NUM_QUADRATURE = 20


def gauss_hermite(num_points: int = NUM_QUADRATURE) -> tuple[np.ndarray, np.ndarray]:
    """Nodes `t` and weights `w / √π` such that E[h(f)] ≈ Σ w h(μ + √2 σ t)."""
    t, w = np.polynomial.hermite.hermgauss(num_points)
    return t, w / np.sqrt(np.pi)


class RBF(eqx.Module):
    """k(x, x') = variance · exp(-|x - x'|² / (2 lengthscale²)), x in R^d.

    The inputs are divided by the lengthscale before their distances are taken
    (n + m divisions, not n · m), as GPJax and GPyTorch do: the gradient's
    lengthscale term then runs through the inputs, not through every entry of
    the n × m matrix: a faster step (`docs/performance.md`).
    """

    lengthscale: Float[Array, ""] = ep.field(constraint=positive)
    variance: Float[Array, ""] = ep.field(constraint=positive)

    def __call__(self, x1: Float[Array, "n d"], x2: Float[Array, "m d"]) -> Array:
        x1, x2 = x1 / self.lengthscale, x2 / self.lengthscale
        sq = jnp.sum((x1[:, None, :] - x2[None, :, :]) ** 2, axis=-1)
        return self.variance * jnp.exp(-0.5 * sq)


class SVGP(eqx.Module):
    """A whitened sparse variational GP with a Bernoulli likelihood.

    **Fields:**

    - `kernel`: the prior covariance (an `RBF`), zero prior mean.
    - `inducing`: the `(m, d)` inducing inputs z (trainable).
    - `q_v`: q(v) = N(m, L Lᵀ) over the whitened inducing variables, a wrapped
      `distrax.MultivariateNormalTri`.
    - `link`: `"logit"` (σ(f), the default) or `"probit"` (Φ(f), squeezed into
      [1e-3, 1 - 1e-3] exactly as GPJax 1.0's `Bernoulli` does, for the benchmark).
      Φ is `½(1 + erf(f/√2))`, as GPJax computes it: the squeeze makes the tail
      accuracy of `jax.scipy.stats.norm.cdf` moot, and it costs more per step.
    - `jitter`: added to the diagonal of K_zz before its Cholesky factorisation.
    """

    kernel: RBF
    inducing: Float[Array, "m d"]
    q_v: ep.FixedDistrax
    link: str = eqx.field(static=True, default="logit")
    jitter: float = eqx.field(static=True, default=1e-6)

    @staticmethod
    def init(
        inducing: Float[Array, "m d"],
        *,
        lengthscale: float = 1.0,
        variance: float = 1.0,
        link: str = "logit",
        jitter: float = 1e-6,
    ) -> SVGP:
        """A parameterised model: q(v) = N(0, I), ready for `ep.fit`.

        **Arguments:**

        - `inducing`: the initial `(m, d)` inducing inputs.
        - `lengthscale`, `variance`: initial RBF hyperparameters.
        - `link`, `jitter`: as the fields.

        **Returns:**

        An `SVGP` whose kernel hyperparameters and Cholesky factor are `ep.Bijector`
        nodes (call `ep.resolve` on it in the loss).
        """
        m = inducing.shape[0]
        dtype = inducing.dtype
        kernel = RBF(jnp.asarray(lengthscale, dtype), jnp.asarray(variance, dtype))
        q_v = ep.FixedDistrax(
            distrax.MultivariateNormalTri,
            jnp.zeros(m, dtype),
            jnp.eye(m, dtype=dtype),
        )
        # `FixedDistrax` builds the distribution once at construction, which an
        # unresolved `ep.Bijector` argument cannot do, so put the Cholesky node in
        # afterwards.
        q_v = eqx.tree_at(
            lambda q: q.scale_tri, q_v, ep.lower_cholesky(jnp.eye(m, dtype=dtype))
        )
        model = SVGP(ep.parameterize(kernel), inducing, q_v, link, jitter)
        return model

    def prior_v(self) -> ep.FixedDistrax:
        """p(v) = N(0, I), the whitened prior of the inducing variables.

        A `MultivariateNormalDiag`, which is what N(0, I) is: the KL against it
        divides by the prior's scale, where a `MultivariateNormalTri` with an
        identity factor would solve M × M triangular systems (and their
        gradients) at every step.
        """
        m = self.inducing.shape[0]
        dtype = self.inducing.dtype
        return ep.FixedDistrax(
            distrax.MultivariateNormalDiag, jnp.zeros(m, dtype), jnp.ones(m, dtype)
        )

    def kl(self) -> Array:
        """KL[q(v) ‖ p(v)], analytically (on a resolved model)."""
        return self.q_v.kl_divergence(self.prior_v())

    def marginals(self, x: Float[Array, "n d"]) -> tuple[Array, Array]:
        """Mean and variance of q(f(x)) = ∫ p(f(x) | u) q(u) du, per row of `x`.

        With A = L_z⁻¹ K_zx: mean = Aᵀ m, variance = k(x, x) - Σ A² + Σ (Lᵀ A)².
        """
        z = self.inducing
        m = z.shape[0]
        kzz = self.kernel(z, z) + self.jitter * jnp.eye(m, dtype=z.dtype)
        lz = jnp.linalg.cholesky(kzz)
        a = jsl.solve_triangular(lz, self.kernel(z, x), lower=True)
        mean = a.T @ self.q_v.loc
        la = self.q_v.scale_tri.T @ a  # (the argument as given: a Cholesky factor)
        var = self.kernel.variance - jnp.sum(a**2, 0) + jnp.sum(la**2, 0)
        return mean, jnp.maximum(var, 1e-12)

    def likelihood(self, f: Array) -> ep.FixedDistrax:
        """p(y | f) as a wrapped `distrax.Bernoulli`."""
        if self.link == "logit":
            return ep.FixedDistrax(distrax.Bernoulli, logits=f)
        phi = 0.5 * (1.0 + jax.scipy.special.erf(f / np.sqrt(2.0)))
        probs = phi * (1 - 2e-3) + 1e-3
        return ep.FixedDistrax(distrax.Bernoulli, probs=probs)

    def expected_log_lik(
        self, x: Float[Array, "n d"], y: Float[Array, " n"]
    ) -> Float[Array, " n"]:
        """E_q(f(x))[log p(y | f(x))] per row, by Gauss–Hermite quadrature."""
        mean, var = self.marginals(x)
        t, w = gauss_hermite()
        f = mean[:, None] + jnp.sqrt(2.0 * var)[:, None] * t  # (n, points)
        return self.likelihood(f).log_prob(y[:, None]) @ w

    def expected_log_lik_mc(
        self,
        x: Float[Array, "n d"],
        y: Float[Array, " n"],
        key: PRNGKeyArray,
        samples: int = 16,
    ) -> Float[Array, " n"]:
        """The same expectation by Monte Carlo, reparameterised: f = μ + σ ε."""
        mean, var = self.marginals(x)
        eps = jax.random.normal(key, (x.shape[0], samples), mean.dtype)
        f = mean[:, None] + jnp.sqrt(var)[:, None] * eps
        return jnp.mean(self.likelihood(f).log_prob(y[:, None]), axis=1)

    def predict_proba(self, x: Float[Array, "n d"]) -> Float[Array, " n"]:
        """p(y = 1 | x) = ∫ p(y = 1 | f) N(f; μ, σ²) df by quadrature."""
        mean, var = self.marginals(x)
        t, w = gauss_hermite()
        f = mean[:, None] + jnp.sqrt(2.0 * var)[:, None] * t
        return self.likelihood(f).prob(jnp.ones_like(f)) @ w


def elbo(model: SVGP, x: Array, y: Array, rows: int) -> Array:
    """The (minibatch) ELBO of a resolved model: `rows / len(x)` Σ E[log p] - KL."""
    return rows / x.shape[0] * jnp.sum(model.expected_log_lik(x, y)) - model.kl()


def make_loss(rows: int, mc: bool = False, samples: int = 16, sharding=None):
    """The negative minibatch ELBO as an `ep.fit` loss.

    **Arguments:**

    - `rows`: N, the number of training rows (the batch sum is scaled by N / B).
    - `mc`: Monte Carlo instead of quadrature; the loss then takes `key`.
    - `samples`: Monte Carlo samples per row.
    - `sharding`: optional `NamedSharding` the batch is constrained to (data
      parallelism: each device computes its part of the batch).
    """

    def batch_of(batch):
        if sharding is not None:
            batch = jax.lax.with_sharding_constraint(batch, sharding)
        return batch

    if mc:

        def loss(model, batch, key):
            model = ep.resolve(model)
            x, y = batch_of(batch)
            ell = model.expected_log_lik_mc(x, y, key, samples)
            return -(rows / x.shape[0] * jnp.sum(ell) - model.kl())

    else:

        def loss(model, batch):
            x, y = batch_of(batch)
            return -elbo(ep.resolve(model), x, y, rows)

    return loss


def latent(x: Float[Array, "n 2"]) -> Float[Array, " n"]:
    """The true latent function g(x) = 6 sin(x₀) cos(x₁)."""
    return 6.0 * jnp.sin(x[:, 0]) * jnp.cos(x[:, 1])


def make_data(n: int, key: PRNGKeyArray) -> tuple[Array, Array]:
    """`n` points x ~ U([-3, 3]²), y ~ Bernoulli(σ(g(x))) as floats 0/1."""
    key_x, key_y = jax.random.split(key)
    x = jax.random.uniform(key_x, (n, 2), minval=-3.0, maxval=3.0)
    y = jax.random.bernoulli(key_y, jax.nn.sigmoid(latent(x))).astype(x.dtype)
    return x, y


def evaluate(model: SVGP, x: Array, y: Array) -> tuple[float, float]:
    """Held-out accuracy and NLPD (mean negative log predictive density)."""
    p = jax.jit(lambda m, x: ep.resolve(m).predict_proba(x))(model, x)
    accuracy = jnp.mean((p > 0.5) == (y > 0.5))
    nlpd = -jnp.mean(ep.FixedDistrax(distrax.Bernoulli, probs=p).log_prob(y))
    return float(accuracy), float(nlpd)


def bayes_classifier(x: Array, y: Array) -> tuple[float, float]:
    """Accuracy and NLPD of the true p(y | x) = σ(g(x)) on (x, y)."""
    g = latent(x)
    accuracy = jnp.mean((g > 0) == (y > 0.5))
    nlpd = -jnp.mean(ep.FixedDistrax(distrax.Bernoulli, logits=g).log_prob(y))
    return float(accuracy), float(nlpd)


def optimiser(learning_rate: float = 0.01, natgrad: float | None = None):
    """adam on every parameter, or natural gradients for q(v) at rate `natgrad`
    and adam on the kernel and inducing inputs."""
    adam = optax.adam(learning_rate)
    if natgrad is None:
        return adam
    return ep.natural_gradient(natgrad, adam, where=lambda m: m.q_v)


def train(
    x: Array,
    y: Array,
    *,
    m: int = 32,
    steps: int = 500,
    batch: int = 256,
    mc: bool = False,
    key: PRNGKeyArray,
    mesh: Mesh | None = None,
    progress: bool = True,
    learning_rate: float = 0.01,
    natgrad: float | None = None,
) -> tuple[SVGP, Array, float]:
    """Fit an SVGP by minibatch ELBO maximisation with `ep.fit` and adam.

    **Arguments:**

    - `x`, `y`: training inputs `(n, d)` and 0/1 labels `(n,)`.
    - `m`: the number of inducing points (initialised at `m` random rows of `x`).
    - `steps`, `batch`, `learning_rate`: adam steps, rows per step, step size.
    - `natgrad`: a natural-gradient rate for q(v) (adam then trains the rest), or
      `None` for adam on everything.
    - `mc`: Monte Carlo expected log-likelihood instead of quadrature.
    - `key`: the PRNG key (inducing points, minibatches and MC draws).
    - `mesh`: a 1-D device mesh with axis `"data"`: shard the data along its rows
      and replicate the model. `None` puts the model on the data's device.
    - `progress`: show `ep.fit`'s progress bar.

    **Returns:**

    `(model, losses, seconds_per_step)`: the trained (parameterised) model, the
    negative ELBO per step and the wall time per step after compilation.
    """
    key_z, key_fit = jax.random.split(key)
    z = x[jax.random.choice(key_z, x.shape[0], (m,), replace=False)]
    model = SVGP.init(jnp.asarray(z))
    sharding = None
    if mesh is None:
        # Commit the model to the data's device: with committed data and an
        # uncommitted model, `ep.fit` compiles its chunk a second time for the
        # (committed) parameters that its first chunk returns.
        model = jax.device_put(model, next(iter(x.devices())))
    else:
        sharding = NamedSharding(mesh, P("data"))
        if x.is_fully_addressable:  # (else each process holds its rows already)
            x, y = jax.device_put((x, y), sharding)
        model = jax.device_put(model, NamedSharding(mesh, P()))  # replicated
    loss = make_loss(x.shape[0], mc=mc, sharding=sharding)
    kwargs = dict(
        optimiser=optimiser(learning_rate, natgrad),
        data=(x, y),
        batch_size=batch,
        key=key_fit,
    )
    # Compile (the same program serves any `steps`; 20 steps are two chunks), then
    # time the run.
    jax.block_until_ready(ep.fit(model, loss, steps=20, progress=False, **kwargs))
    start = time.perf_counter()
    model, losses = ep.fit(model, loss, steps=steps, progress=progress, **kwargs)
    jax.block_until_ready(model)
    return model, losses, (time.perf_counter() - start) / steps


def process_main(index: int, processes: int, port: int, result: str, **kw) -> None:
    """One of `--processes P`: join the others (`jax.distributed`, CPU devices
    joined by gloo), keep only this process's share of the rows, train data-
    parallel over every process's devices, and (process 0) save the result."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", processes, index)
    with jax.enable_x64(True):
        n, seed = kw.pop("n"), kw.pop("seed")
        key_data, _, key_train = jax.random.split(jax.random.key(seed), 3)
        # Every process makes the same rows from the seed (a real run reads its
        # own files instead) and keeps rows index * n / P .. (index + 1) * n / P.
        x, y = (np.asarray(a) for a in make_data(n, key_data))
        mine = slice(index * n // processes, (index + 1) * n // processes)
        mesh = jax.make_mesh(
            (jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,)
        )
        rows = NamedSharding(mesh, P("data"))
        x = jax.make_array_from_process_local_data(rows, x[mine], (n, 2))
        y = jax.make_array_from_process_local_data(rows, y[mine], (n,))
        model, losses, per_step = train(
            x, y, key=key_train, mesh=mesh, progress=False, **kw
        )
        if index == 0:
            leaves = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))
            np.savez(
                result, losses=np.asarray(losses), per_step=per_step,
                **{f"leaf{i}": np.asarray(a) for i, a in enumerate(leaves)},
            )  # fmt: skip


def run_processes(processes: int, **kw) -> dict:
    """Launch `processes` local processes of `process_main` (coordinator on
    127.0.0.1) and return process 0's saved result."""
    import socket
    import subprocess
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.npz")
        options = [f"--{k}={v}" for k, v in kw.items() if k not in ("mc", "natgrad")]
        options += ["--mc"] if kw.get("mc") else []
        options += [f"--natgrad={kw['natgrad']}"] if kw.get("natgrad") else []
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    *options,
                    f"--processes={processes}",
                    f"--process-index={i}",
                    f"--port={port}",
                    f"--result={result}",
                ]
            )  # fmt: skip
            for i in range(processes)
        ]
        codes = [child.wait() for child in children]
        if any(codes):
            raise RuntimeError(f"the processes exited with {codes}")
        with np.load(result) as saved:
            return dict(saved)


def peak_memory_mb() -> float:
    """The peak resident memory of this process so far, in MB (Linux: KB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plot(model: SVGP, x: Array, y: Array, losses: Array, path: str) -> None:
    """Predictive probability surface with data and inducing points; ELBO trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    resolved = ep.resolve(model)
    lo = min(-3.0, float(resolved.inducing.min())) - 0.2
    hi = max(3.0, float(resolved.inducing.max())) + 0.2
    grid = jnp.linspace(lo, hi, 120)
    g0, g1 = jnp.meshgrid(grid, grid)
    xs = jnp.stack([g0.ravel(), g1.ravel()], axis=1)
    p = jax.jit(lambda m, x: m.predict_proba(x))(resolved, xs).reshape(g0.shape)
    fig, (ax, ax_elbo) = plt.subplots(1, 2, figsize=(11, 4.5))
    levels = jnp.linspace(0.0, 1.0, 11)
    surface = ax.contourf(g0, g1, p, levels=levels, cmap="RdBu_r", alpha=0.8)
    ax.contour(g0, g1, p, levels=[0.5], colors="k", linewidths=1)
    shown = min(x.shape[0], 1000)
    ax.scatter(*x[:shown].T, c=y[:shown], cmap="RdBu_r", s=6, edgecolors="none")
    ax.scatter(*resolved.inducing.T, marker="x", color="k", s=40, label="inducing")
    ax.set(xlabel="x₀", ylabel="x₁", title="SVGP p(y = 1 | x)")
    ax.legend(loc="upper right")
    fig.colorbar(surface, ax=ax)
    ax_elbo.plot(-np.asarray(losses), linewidth=0.8)
    ax_elbo.set(xlabel="step", ylabel="minibatch ELBO", title="ELBO trace")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gradient_difference(x: Array, y: Array, m: int, key, mesh: Mesh) -> float:
    """Relative max difference between the single-device and the sharded gradient
    of the negative ELBO at the initial model, on the first 8 · 1024 rows."""
    rows = min(x.shape[0], 8192)
    x, y = x[:rows], y[:rows]
    key_z, _ = jax.random.split(key)
    z = x[jax.random.choice(key_z, rows, (m,), replace=False)]
    model = SVGP.init(jnp.asarray(z))
    loss = make_loss(x.shape[0])
    grad = eqx.filter_jit(eqx.filter_grad(loss))
    single = grad(model, (x, y))
    data = jax.device_put((x, y), NamedSharding(mesh, P("data")))
    sharded = grad(jax.device_put(model, NamedSharding(mesh, P())), data)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(single))
    return _max_difference(single, sharded) / scale


def _max_difference(a: SVGP, b: SVGP) -> float:
    leaves = zip(
        jax.tree_util.tree_leaves(eqx.filter(a, eqx.is_array)),
        jax.tree_util.tree_leaves(eqx.filter(b, eqx.is_array)),
    )
    return max(float(jnp.max(jnp.abs(u - jax.device_get(v)))) for u, v in leaves)


def main(
    n: int = 2000,
    m: int = 32,
    steps: int = 500,
    batch: int = 256,
    mc: bool = False,
    devices: int = 1,
    n_test: int = 2000,
    out: str | None = "svgp.png",
    seed: int = 0,
    progress: bool = True,
    processes: int = 1,
    natgrad: float | None = None,
) -> dict:
    """Train on `n` synthetic points, evaluate on `n_test`, print and plot.

    **Arguments:**

    - `n`, `m`, `steps`, `batch`, `mc`, `natgrad`: data size and `train`'s
      arguments (`natgrad`: natural gradients for q(v) at that rate).
    - `devices`: with more than 1, also train with the data sharded over that many
      devices (they must exist: set `XLA_FLAGS` before JAX is imported) and compare
      with the single-device run.
    - `n_test`: held-out points.
    - `out`: the PNG to write, or `None`.
    - `seed`: the PRNG seed of data, inducing points and minibatches.
    - `progress`: show progress bars.
    - `processes`: with more than 1, also train in that many local processes,
      each holding only its share of the rows (`jax.distributed`), and compare
      with the single-device run.

    **Returns:**

    A dict with the trained `model`, `losses`, `accuracy`, `nlpd`, the Bayes
    classifier's `bayes_accuracy` and `bayes_nlpd`, `seconds_per_step`,
    `peak_mb`, and with `devices > 1` the `sharded_model`, `sharded_losses` and
    `max_difference` (largest |difference| of the final parameters and of the
    minibatch-ELBO trace) and `gradient_difference` (of the initial gradient,
    relative to its largest entry); with `processes > 1`, `process_losses`,
    `process_seconds_per_step` and `process_difference`.
    """
    with jax.enable_x64(True):
        key_data, key_test, key_train = jax.random.split(jax.random.key(seed), 3)
        x, y = make_data(n, key_data)
        x_test, y_test = make_data(n_test, key_test)
        method = "Monte Carlo (16 samples)" if mc else f"{NUM_QUADRATURE}-point G-H"
        how = "adam(0.01)"
        if natgrad is not None:
            how = f"natural gradients ({natgrad}) for q(v), adam(0.01) for the rest"
        print(
            f"SVGP classification, n = {n:,}, M = {m} inducing points, batch "
            f"{batch}, {steps} steps of {how}, {method}, float64"
        )
        single = jax.devices()[0]
        x, y = jax.device_put((x, y), single)
        model, losses, per_step = train(
            x, y, m=m, steps=steps, batch=batch, mc=mc, key=key_train,
            progress=progress, natgrad=natgrad,
        )  # fmt: skip
        resolved = ep.resolve(model)
        final_elbo = float(elbo(resolved, x, y, n)) if n <= 200_000 else None
        accuracy, nlpd = evaluate(model, x_test, y_test)
        bayes_accuracy, bayes_nlpd = bayes_classifier(x_test, y_test)
        result = dict(
            model=model,
            losses=losses,
            accuracy=accuracy,
            nlpd=nlpd,
            bayes_accuracy=bayes_accuracy,
            bayes_nlpd=bayes_nlpd,
            seconds_per_step=per_step,
            peak_mb=peak_memory_mb(),
            final_elbo=final_elbo,
        )
        print(f"fitted lengthscale {float(resolved.kernel.lengthscale):.4f}, "
              f"variance {float(resolved.kernel.variance):.4f}")  # fmt: skip
        print(
            f"minibatch ELBO: step 0 {-float(losses[0]):.2f}, last 50 steps' mean "
            f"{-float(jnp.mean(losses[-50:])):.2f}"
        )
        if final_elbo is not None:
            print(f"full-data ELBO at the end: {final_elbo:.4f}")
        print(
            f"time per step {1e3 * per_step:.3f} ms (compiled, {steps} steps), "
            f"peak memory {result['peak_mb']:.0f} MB"
        )
        print(f"held-out ({n_test:,} points)    accuracy    NLPD")
        print(f"  SVGP                      {accuracy:8.4f}  {nlpd:6.4f}")
        print(f"  Bayes classifier σ(g(x))  {bayes_accuracy:8.4f}  {bayes_nlpd:6.4f}")
        if devices > 1:
            if len(jax.devices()) < devices:
                raise RuntimeError(
                    f"{devices} devices requested, {len(jax.devices())} present: set "
                    "XLA_FLAGS=--xla_force_host_platform_device_count="
                    f"{devices} before JAX is imported (the command line does)."
                )
            mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
            sharded, sharded_losses, sharded_per_step = train(
                x, y, m=m, steps=steps, batch=batch, mc=mc, key=key_train,
                mesh=mesh, progress=progress, natgrad=natgrad,
            )  # fmt: skip
            sharded_elbo = -float(sharded_losses[-1])
            difference = max(
                _max_difference(model, sharded),
                abs(-float(losses[-1]) - sharded_elbo),
                float(jnp.max(jnp.abs(losses - jax.device_get(sharded_losses)))),
            )
            gradient_difference = _gradient_difference(x, y, m, key_train, mesh)
            relative = np.abs(np.asarray(losses) - np.asarray(sharded_losses))
            relative /= np.abs(np.asarray(losses))
            parted = np.flatnonzero(relative > 1e-6)
            result.update(
                sharded_model=sharded,
                sharded_losses=sharded_losses,
                max_difference=difference,
                gradient_difference=gradient_difference,
            )
            print(
                f"sharded over {devices} devices (data rows P('data'), model "
                f"replicated): {1e3 * sharded_per_step:.3f} ms per step"
            )
            print(f"  last minibatch ELBO single device {-float(losses[-1]):.12f}")
            print(f"  last minibatch ELBO sharded       {sharded_elbo:.12f}")
            print(f"  max |difference| (parameters, ELBO trace) = {difference:.2e}")
            print(
                "  ELBO traces equal to 1e-6 relative "
                + (f"up to step {parted[0]}" if len(parted) else "at every step")
            )
            print(
                "  gradient at the initial model, max |difference| / max |gradient| "
                f"= {gradient_difference:.2e}"
            )
        if processes > 1:
            saved = run_processes(
                processes,
                n=n,
                m=m,
                steps=steps,
                batch=batch,
                mc=mc,
                seed=seed,
                natgrad=natgrad,
            )
            ours = jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))
            difference = max(
                float(np.max(np.abs(np.asarray(a) - saved[f"leaf{i}"])))
                for i, a in enumerate(ours)
            )
            trace = float(np.max(np.abs(np.asarray(losses) - saved["losses"])))
            result.update(
                process_losses=saved["losses"],
                process_seconds_per_step=float(saved["per_step"]),
                process_difference=max(difference, trace),
            )
            print(
                f"{processes} processes, each holding {n // processes:,} rows: "
                f"{1e3 * float(saved['per_step']):.3f} ms per step (one process: "
                f"{1e3 * per_step:.3f})"
            )
            print(f"  max |difference| of the final parameters = {difference:.2e}")
            print(f"  max |difference| of the ELBO traces = {trace:.2e}")
        if out is not None:
            plot(model, x, y, losses, out)
            print(f"wrote {out}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--mc", action="store_true", help="Monte Carlo, not G-H")
    parser.add_argument(
        "--natgrad",
        type=float,
        nargs="?",
        const=0.1,
        default=None,
        metavar="RATE",
        help="natural gradients for q(v) at RATE (0.1 if omitted), adam for the rest",
    )
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="svgp.png", help="PNG path, or 'none'")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_index is not None:  # one of the processes `--processes` starts
        process_main(
            args.process_index, args.processes, args.port, args.result, n=args.n,
            m=args.m, steps=args.steps, batch=args.batch, mc=args.mc, seed=args.seed,
            natgrad=args.natgrad,
        )  # fmt: skip
        sys.exit()
    main(
        n=args.n,
        m=args.m,
        steps=args.steps,
        batch=args.batch,
        mc=args.mc,
        natgrad=args.natgrad,
        devices=args.devices,
        n_test=args.n_test,
        out=None if args.out.lower() == "none" else args.out,
        seed=args.seed,
        processes=args.processes,
    )
