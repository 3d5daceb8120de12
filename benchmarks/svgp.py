"""SVGP classification: eqxprob against GPJax 1.0 and hand-written JAX, in one run.

The data and training set-up are GPJax 1.0's own (its sdist's `docs/examples`):

- data as in `classification.py`: `key = jr.key(42)`, `key, subkey = jr.split(key)`,
  x ~ U(-1, 1) of shape (n, 1), y = ½ sign(cos(3x + 0.05·noise)) + ½; held-out
  inputs `linspace(-1, 1, 500)` (its `xtest`), labelled by the same process with
  `jr.key(7)`. That example has n = 100 and fits a full (non-sparse) latent by MAP;
  here n = 50,000 (`uncollapsed_vi.py`'s size) for a sparse model;
- the sparse model, optimiser and steps as in `uncollapsed_vi.py`: 50 inducing
  inputs `linspace` over the input range (trainable), zero mean, `RBF()`
  (lengthscale 1, variance 1), adam with `warmup_cosine_decay_schedule(0, 0.02, 75,
  2000, 0.001)`, 3000 steps, minibatches of 128 drawn with replacement, `jr.key(42)`.
  The likelihood is GPJax's `Bernoulli` (a probit link squeezed into [1e-3, 1-1e-3],
  20-point Gauss–Hermite) and the family `WhitenedVariationalGaussian`, GPJax 1.0's
  SVGP; eqxprob's model (examples/svgp_classification.py) runs with
  `link="probit"`, the same squeeze and jitter 1e-6, so both maximise the same ELBO.

Rows (float64):

- eqxprob: the example's `SVGP` trained with `ep.fit`;
- hand-written JAX: a dict of unconstrained arrays, the same maths, one jitted
  `lax.scan`, fed the very minibatches `ep.fit` draws. Its gradient at the initial
  values equals eqxprob's (printed below the table: a check of the wrappers and
  bijectors); the trajectories then part by rounding only, which adam amplifies
  in the directions whose gradients are ~0 (its steps are ~lr whatever |g|);
- GPJax: `gpx.fit(model=q, objective=-elbo, ...)` as the docs show, wrapped in
  `eqx.filter_jit` so that its `lax.scan` compiles once.

GPJax draws its minibatches differently (`jr.choice` on split keys), so its numbers
differ from eqxprob's by optimisation noise only. Each variant trains from its
initial values once per round, in interleaved rounds (order rotated), after a
compiling call; the table shows the median ms per step and its ratio to GPJax, plus
held-out accuracy, NLPD (mean negative log predictive density) and the final
full-data ELBO (each library's own ELBO function; the initial ELBOs are printed to
show the two objectives agree).

Run: `python benchmarks/svgp.py [--quick] [--n N] [--steps S] [--rounds R]`
(GPJax comes with `pip install -e ".[bench]"`; without it its row says so).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import hand_svgp, table


jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from svgp_classification import SVGP, elbo, make_loss  # noqa: E402

import eqxprob as ep  # noqa: E402


M, BATCH, JITTER = 50, 128, 1e-6
T, W = np.polynomial.hermite.hermgauss(20)
W = W / np.sqrt(np.pi)


def schedule() -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=0.02, warmup_steps=75, decay_steps=2000,
        end_value=0.001,
    )  # fmt: skip


def make_data(n: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """GPJax's classification data (seed 42), and held-out data at its `xtest`."""
    key = jax.random.key(42)
    key, subkey = jax.random.split(key)
    x = jax.random.uniform(key, shape=(n, 1), minval=-1.0, maxval=1.0)
    noise = jax.random.normal(subkey, shape=x.shape) * 0.05
    y = 0.5 * jnp.sign(jnp.cos(3 * x + noise)) + 0.5
    x_test = jnp.linspace(-1.0, 1.0, 500).reshape(-1, 1)
    noise = jax.random.normal(jax.random.key(7), shape=x_test.shape) * 0.05
    y_test = 0.5 * jnp.sign(jnp.cos(3 * x_test + noise)) + 0.5
    return x, y, x_test, y_test


def nlpd_and_accuracy(p: jax.Array, y: jax.Array) -> tuple[float, float]:
    p, y = jnp.ravel(p), jnp.ravel(y)
    accuracy = jnp.mean((p > 0.5) == (y > 0.5))
    nlpd = -jnp.mean(y * jnp.log(p) + (1 - y) * jnp.log1p(-p))
    return float(accuracy), float(nlpd)


class Variant:
    """A way to train: `call()` trains from the initial values and returns the
    trained model; `summary(trained)` gives (accuracy, NLPD, final ELBO, initial
    ELBO)."""

    def __init__(self, name: str, call: Callable[[], Any], summary: Callable):
        self.name, self.call, self.summary = name, call, summary
        self.times: list[float] = []
        self.result: Any = None


# --- eqxprob -----------------------------------------------------------------


def eqxprob_variant(x, y, x_test, y_test, z, steps: int) -> Variant:
    n = x.shape[0]
    model = SVGP.init(z, link="probit", jitter=JITTER)
    loss = make_loss(n)
    data = (x, y.ravel())
    # One optimiser object for every call: `ep.fit` compares a fresh
    # `optax.adam(schedule)` by structure and, with a schedule, finds it new and
    # recompiles (a constant learning rate does not).
    optimiser = optax.adam(schedule())

    def call():
        trained, losses = ep.fit(
            model, loss, optimiser=optimiser, steps=steps, data=data,
            batch_size=BATCH, key=jax.random.key(42), progress=False,
        )  # fmt: skip
        return jax.block_until_ready(trained)

    def summary(trained):
        r = ep.resolve(trained)
        accuracy, nlpd = nlpd_and_accuracy(r.predict_proba(x_test), y_test)
        initial = float(elbo(ep.resolve(model), x, y.ravel(), n))
        return accuracy, nlpd, float(elbo(r, x, y.ravel(), n)), initial

    return Variant("eqxprob (ep.fit)", call, summary)


# --- hand-written JAX --------------------------------------------------------


def hand_params(z) -> dict:
    return hand_svgp.params(z)


def hand_elbo(p: dict, x, y, rows: int):
    return -hand_svgp.loss(M, rows, T, W, JITTER)(p, x, y)


def hand_variant(x, y, x_test, y_test, z, steps: int) -> Variant:
    n = x.shape[0]
    y1 = y.ravel()
    optimiser = optax.adam(schedule())
    # `ep.fit`'s minibatches: rows drawn with `randint` from fold_in(key, step).
    batch_key = jax.random.split(jax.random.key(42))[0]

    @jax.jit
    def run(p):
        def body(carry, step):
            p, state = carry
            index = jax.random.randint(
                jax.random.fold_in(batch_key, step), (BATCH,), 0, n
            )
            value, grads = jax.value_and_grad(
                lambda q: -hand_elbo(q, x[index], y1[index], n)
            )(p)
            updates, state = optimiser.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), value

        (p, _), losses = jax.lax.scan(
            body, (p, optimiser.init(p)), jnp.arange(steps, dtype=jnp.int32)
        )
        return p, losses

    initial = hand_params(z)

    def call():
        return jax.block_until_ready(run(initial)[0])

    def summary(p):
        # Predictive p(y = 1 | x*) by quadrature, as the SVGP's.
        return (
            *_hand_predict(p, x_test, y_test),
            float(hand_elbo(p, x, y1, n)),
            float(hand_elbo(initial, x, y1, n)),
        )

    return Variant("hand-written JAX (lax.scan)", call, summary)


def _hand_predict(p, x_test, y_test):
    # Reuse the example's model maths through a model built from the dict.
    r, c = np.tril_indices(M)
    entries = jnp.where(r == c, jax.nn.softplus(p["tril"]), p["tril"])
    lq = jnp.zeros((M, M)).at[r, c].set(entries)
    model = SVGP.init(p["z"], link="probit", jitter=JITTER)
    model = ep.resolve(model)
    model = eqx.tree_at(
        lambda m: (m.kernel.lengthscale, m.kernel.variance, m.q_v.loc, m.q_v.scale_tri),
        model,
        (jax.nn.softplus(p["ls"]), jax.nn.softplus(p["var"]), p["m"], lq),
    )
    return nlpd_and_accuracy(model.predict_proba(x_test), y_test)


# --- GPJax -------------------------------------------------------------------


def gpjax_variant(x, y, x_test, y_test, z, steps: int) -> Variant:
    import gpjax as gpx

    data = gpx.Dataset(X=x, y=y)
    prior = gpx.gps.Prior(
        mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF(),
        jitter=JITTER,
    )  # fmt: skip
    posterior = prior * gpx.likelihoods.Bernoulli()
    q = gpx.variational_families.WhitenedVariationalGaussian(
        model=posterior, inducing_inputs=z
    )

    @eqx.filter_jit
    def run(q):
        trained, _ = gpx.fit(
            model=q,
            objective=lambda p, d: -gpx.objectives.elbo(p, d),
            train_data=data,
            optim=optax.adam(learning_rate=schedule()),
            num_iters=steps,
            key=jax.random.key(42),
            batch_size=BATCH,
            verbose=False,
            safe=False,
        )
        return trained

    def call():
        return jax.block_until_ready(run(q))

    def summary(trained):
        predictive = trained.model.likelihood(trained(x_test))
        accuracy, nlpd = nlpd_and_accuracy(predictive.mean, y_test)
        final = float(gpx.objectives.elbo(trained, data))
        return accuracy, nlpd, final, float(gpx.objectives.elbo(q, data))

    return Variant("GPJax 1.0 gpx.fit (Whitened SVGP)", call, summary)


def gradient_gap(x, y, z) -> float:
    """Relative max difference of the two -ELBO gradients (same parameterisation:
    softplus, and `ep.lower_cholesky`'s row-major lower triangle = `tril_indices`)."""
    n, y1 = x.shape[0], y.ravel()
    model = SVGP.init(z, link="probit", jitter=JITTER)
    g_e = eqx.filter_grad(lambda m: -elbo(ep.resolve(m), x, y1, n))(model)
    g_h = jax.grad(lambda p: -hand_elbo(p, x, y1, n))(hand_params(z))
    pairs = [
        (g_e.kernel.lengthscale.param, g_h["ls"]),
        (g_e.kernel.variance.param, g_h["var"]),
        (g_e.inducing, g_h["z"]),
        (g_e.q_v.loc, g_h["m"]),
        (g_e.q_v.scale_tri.param, g_h["tril"]),
    ]
    scale = max(float(jnp.max(jnp.abs(b))) for _, b in pairs)
    return max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs) / scale


# --- driver ------------------------------------------------------------------


def run(n: int, steps: int, rounds: int) -> None:
    x, y, x_test, y_test = make_data(n)
    z = jnp.linspace(-1.0, 1.0, M).reshape(-1, 1)
    makers = [eqxprob_variant, hand_variant]
    has_gpjax = importlib.util.find_spec("gpjax") is not None
    if has_gpjax:
        makers.append(gpjax_variant)
    variants = [make(x, y, x_test, y_test, z, steps) for make in makers]
    compile_s = {}
    for v in variants:  # the first call compiles
        start = time.perf_counter()
        v.call()
        compile_s[v.name] = time.perf_counter() - start
    for r in range(rounds):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            start = time.perf_counter()
            v.result = v.call()
            v.times.append((time.perf_counter() - start) / steps)
    baseline = variants[-1] if has_gpjax else variants[0]
    base = statistics.median(baseline.times)
    rows = []
    for v in variants:
        accuracy, nlpd, final, initial = v.summary(v.result)
        per_step = statistics.median(v.times)
        rows.append(
            [
                v.name,
                f"{accuracy:.4f}",
                f"{nlpd:.4f}",
                f"{final:.3f}",
                f"{initial:.3f}",
                f"{1e3 * per_step:.3f}",
                f"{per_step / base:.2f}",
                f"{compile_s[v.name] - steps * per_step:.1f}",
            ]
        )
    if not has_gpjax:
        rows.append(["GPJax 1.0", *["not installed"] * 7])
    print(
        f"SVGP classification, GPJax's data (seed 42): n = {n:,}, M = {M} inducing, "
        f"batch {BATCH}, {steps} steps of adam(warmup-cosine 0.02), probit "
        f"Bernoulli, 20-point Gauss-Hermite, float64; {rounds} interleaved rounds"
    )
    ratio = f"ratio to {'GPJax' if has_gpjax else 'eqxprob'}"
    print(
        table(
            [
                "variant",
                "accuracy",
                "NLPD",
                "final ELBO",
                "initial ELBO",
                "ms/step",
                ratio,
                "compile s",
            ],
            rows,
        )  # fmt: skip
    )
    print(
        "max |gradient of -ELBO|, eqxprob vs hand-written, at the initial values "
        f"(full data, relative): {gradient_gap(x, y, z):.1e}"
    )
    print(
        "held-out: GPJax's xtest = linspace(-1, 1, 500), labels from the same "
        "process (jr.key(7)). ms/step: median over rounds of a whole "
        f"{steps}-step training / {steps}, compiled; 'compile s': first call "
        "minus a median one."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="n=5000, 300 steps")
    args = parser.parse_args()
    if args.quick:
        args.n, args.steps, args.rounds = 5000, 300, 2
    run(args.n, args.steps, args.rounds)
