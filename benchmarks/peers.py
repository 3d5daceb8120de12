"""eqxprob against hand-written JAX, GPJax 1.0 and numpyro: the GPU table of issue
#28 (SVGP, exact GP, mean-field VI), in one run of under 6 minutes on one GPU.

Each problem is one objective, trained with adam(0.01) by each variant:

- hand-written: the maths by hand on a dict of unconstrained arrays (softplus for
  positive values), one `jax.jit(lax.scan)` of all the steps, fed the minibatch
  rows `ep.fit` draws (`randint(fold_in(k, step))`);
- eqxprob: the example's model (`examples/svgp_classification.py` with the probit
  link, `examples/gp_regression.py`) or `ep.guide` + `ep.elbo`, trained by `ep.fit`;
- GPJax 1.0: `gpx.fit` as its docs show (`WhitenedVariationalGaussian` + `elbo`,
  `conjugate_mll`), inside `eqx.filter_jit` so that its `lax.scan` compiles once;
- numpyro (VI only): `AutoNormal` + `Trace_ELBO` with a subsampling `plate`,
  `svi.update` in a `jax.jit(lax.scan)`, and `svi.run`.

Per step is the time difference between warm calls of S steps and of one step
(min over interleaved rounds), so a call's own costs (for `ep.fit`, its trace at
every call) drop out, and a variant's timed calls of S steps all run one
program (a `jit(scan)` of S steps and one of 2S would be two). S is large enough
that the steps dwarf that cost (4,000 SVGP steps on the CPU; 1,024 on a GPU); numpyro
runs at most 1,000, its steps being 10-50 times longer. "compile" is a
first call of S steps minus a warm one, and "XLA compile" the backend
compilation JAX reports of the steps' program (its largest of a call), the min
and median of `--compiles` fresh compiles (after `jax.clear_caches()`,
interleaved) of the hand-written and eqxprob columns: a single compile is
noisy. float32.

Run: `python benchmarks/peers.py [--small] [--rounds R] [--compiles K] [--steps S]
[--only TEXT]` (`--small`: CPU sizes, the benchmark smoke check; `--steps`: S for
every problem; `--only`: the problems whose name contains TEXT). GPJax comes
with `pip install -e ".[bench]"`.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import pathlib
import sys
import time
import warnings
from collections.abc import Callable

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from _common import hand_svgp, table


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

import gp_regression  # noqa: E402
import svgp_classification as svgp  # noqa: E402

import eqxprob as ep  # noqa: E402


LR = 0.01
warnings.filterwarnings("ignore", message=".* is not of type float64")  # (GPJax)
Run = Callable[[int], object]  # steps -> a result (blocked on)


def _isp(v: float) -> jax.Array:
    return jnp.log(jnp.expm1(jnp.float32(v)))


def _scan(loss, params, data=None, batch=None, key=None) -> Run:
    """The hand-written loop: `loss(p, batch, key)` in one jitted `lax.scan` per
    number of steps, with `ep.fit`'s draws of rows and keys."""
    optimiser = optax.adam(LR)
    keys = jax.random.split(key) if key is not None else None
    rows = None if data is None else data[0].shape[0]

    def body(carry, i):
        p, s = carry
        b = data
        if batch is not None:
            index = jax.random.randint(
                jax.random.fold_in(keys[0], i), (batch,), 0, rows
            )
            b = tuple(d[index] for d in data)
        k = None if keys is None else jax.random.fold_in(keys[1], i)
        v, g = jax.value_and_grad(loss)(p, b, k)
        u, s = optimiser.update(g, s, p)
        return (optax.apply_updates(p, u), s), v

    @functools.partial(jax.jit, static_argnums=1)
    def run(p, steps):
        return jax.lax.scan(body, (p, optimiser.init(p)), jnp.arange(steps))

    return lambda steps: run(params, steps)


def _fit(model, loss, steps, **kw) -> object:
    return ep.fit(
        model, loss, optimiser=optax.adam(LR), steps=steps, progress=False, **kw
    )


# --- SVGP classification -----------------------------------------------------


def svgp_variants(n: int, m: int, batch: int) -> dict[str, Run]:
    x, y = svgp.make_data(n, jax.random.key(1))
    z, key = x[:m], jax.random.key(2)
    t, w = (jnp.asarray(a, jnp.float32) for a in svgp.gauss_hermite())
    jitter = 1e-6

    negative_elbo = hand_svgp.loss(m, n, t, w, jitter)
    hand_loss = lambda p, b, _: negative_elbo(p, *b)  # noqa: E731
    hand = hand_svgp.params(z)
    model = svgp.SVGP.init(z, link="probit", jitter=jitter)
    loss = svgp.make_loss(n)
    variants = {
        "hand-written": _scan(hand_loss, hand, (x, y), batch, key),
        "eqxprob": lambda s: _fit(
            model, loss, s, data=(x, y), batch_size=batch, key=key
        ),
    }
    if importlib.util.find_spec("gpjax"):
        import gpjax as gpx

        data = gpx.Dataset(X=x, y=y[:, None])
        prior = gpx.gps.Prior(
            mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF(),
            jitter=jitter,
        )  # fmt: skip
        q = gpx.variational_families.WhitenedVariationalGaussian(
            model=prior * gpx.likelihoods.Bernoulli(),
            inducing_inputs=z,
        )
        variants["GPJax 1.0"] = _gpjax(q, gpx.objectives.elbo, data, batch)
    return variants


def _gpjax(model, objective, data, batch: int) -> Run:
    import gpjax as gpx

    @eqx.filter_jit
    def run(model, steps: int):
        return gpx.fit(
            model=model, objective=lambda p, d: -objective(p, d), train_data=data,
            optim=optax.adam(LR), num_iters=steps, key=jax.random.key(2),
            batch_size=batch, verbose=False, safe=False,
        )  # fmt: skip

    return lambda s: run(model, s)


# --- exact GP regression -----------------------------------------------------


def gp_variants(n: int) -> dict[str, Run]:
    x, y = gp_regression.make_data(n)

    def hand_loss(p, _b, _k):
        ls, var, noise = (jax.nn.softplus(p[k]) for k in ("ls", "var", "noise"))
        kxx = var * jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2)
        lower = jnp.linalg.cholesky(kxx + noise * jnp.eye(n))
        alpha = jax.scipy.linalg.solve_triangular(lower, y, lower=True)
        log_det = jnp.sum(jnp.log(jnp.diag(lower)))
        return 0.5 * alpha @ alpha + log_det + 0.5 * n * jnp.log(2 * jnp.pi)

    hand = {"ls": _isp(1.0), "var": _isp(1.0), "noise": _isp(0.5)}
    model = ep.parameterize(gp_regression.initial_model())
    loss = lambda p: ep.resolve(p).nlml(x, y)  # noqa: E731
    variants = {
        "hand-written": _scan(hand_loss, hand),
        "eqxprob": lambda s: _fit(model, loss, s),
    }
    if importlib.util.find_spec("gpjax"):
        import gpjax as gpx

        data = gpx.Dataset(X=x[:, None], y=y[:, None])
        prior = gpx.gps.Prior(
            mean_function=gpx.mean_functions.Zero(), kernel=gpx.kernels.RBF(),
            jitter=0.0,
        )  # fmt: skip
        posterior = prior * gpx.likelihoods.Gaussian(obs_stddev=0.7)
        variants["GPJax 1.0"] = _gpjax(
            posterior, gpx.objectives.conjugate_mll, data, -1
        )
    return variants


# --- mean-field VI: Bayesian logistic regression -----------------------------


class Logistic(eqx.Module):
    w: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))


def vi_variants(n: int, d: int, batch: int) -> dict[str, Run]:
    kx, kw, ky = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (n, d))
    y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ jax.random.normal(kw, (d,))))
    y = y.astype(x.dtype)
    key = jax.random.key(3)

    def loglik(w, xb, yb):
        logits = xb @ w
        return n / xb.shape[0] * jnp.sum(yb * logits - jax.nn.softplus(logits))

    def hand_loss(p, b, k):
        scale = jax.nn.softplus(p["raw"])
        w = p["loc"] + scale * jax.random.normal(k, (d,))
        prior = jnp.sum(-0.5 * jnp.log(2 * jnp.pi) - 0.5 * (p["loc"] ** 2 + scale**2))
        entropy = jnp.sum(0.5 * jnp.log(2 * jnp.pi * jnp.e) + jnp.log(scale))
        return -(loglik(w, *b) + prior + entropy)

    hand = {"loc": jnp.zeros(d), "raw": jnp.full(d, _isp(0.1))}
    guide = ep.guide(Logistic(jnp.zeros(d)))

    def loss(g, b, key):
        return -ep.elbo(g, lambda m: loglik(m.w, *b), key)

    variants = {
        "hand-written": _scan(hand_loss, hand, (x, y), batch, key),
        "eqxprob": lambda s: _fit(
            guide, loss, s, data=(x, y), batch_size=batch, key=key
        ),
    }
    if importlib.util.find_spec("numpyro"):
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import SVI, Trace_ELBO
        from numpyro.infer.autoguide import AutoNormal

        def model():
            w = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
            with numpyro.plate("rows", n, subsample_size=batch) as index:
                numpyro.sample("y", dist.Bernoulli(logits=x[index] @ w), obs=y[index])

        svi = SVI(
            model, AutoNormal(model, init_scale=0.1), optax.adam(LR), Trace_ELBO()
        )
        state = svi.init(key)

        @functools.partial(jax.jit, static_argnums=1)
        def scanned(state, steps):
            return jax.lax.scan(lambda s, _: svi.update(s), state, None, length=steps)

        variants["numpyro svi.update in jit(scan)"] = lambda s: scanned(state, s)
        variants["numpyro svi.run"] = lambda s: svi.run(
            key, s, progress_bar=False, init_state=state
        )
    return variants


# --- driver ------------------------------------------------------------------


def _seconds(run: Run, steps: int) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run(steps))
    return time.perf_counter() - start


_XLA: list[float] = []  # each XLA compile's seconds (JAX's own compile events)
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **_: (
        event == "/jax/core/compile/backend_compile_duration" and _XLA.append(secs)
    )
)
COMPILED = ["hand-written", "eqxprob"]  # (the columns compiled `--compiles` times)


def _compile_seconds(run: Run, steps: int) -> float:
    """The XLA compile of `run`'s largest program, compiled afresh."""
    jax.clear_caches()
    del _XLA[:]
    _seconds(run, steps)
    return max(_XLA, default=0.0)


def measure(
    variants: dict[str, Run], steps: int, rounds: int, compiles: int
) -> dict[str, tuple]:
    """name -> (ms per step, compile s, XLA compile s: min, median)."""
    # (numpyro's steps are 10-50 times the others': 1,000 dwarf its call's cost)
    length = {
        n: min(steps, 1000) if n.startswith("numpyro") else steps for n in variants
    }
    first = {name: _seconds(run, length[name]) for name, run in variants.items()}
    for run in variants.values():
        _seconds(run, 1)  # (compiles the hand-written and GPJax programs)
    times = {(name, s): [] for name in variants for s in (1, length[name])}
    for r in range(rounds):
        order = list(times) if r % 2 == 0 else list(times)[::-1]
        for name, s in order:
            times[name, s].append(_seconds(variants[name], s))
    xla = {name: [] for name in COMPILED}  # (last: it clears JAX's caches)
    for r in range(compiles):
        for name in COMPILED if r % 2 == 0 else COMPILED[::-1]:
            xla[name].append(_compile_seconds(variants[name], steps))
    out = {}
    for name in variants:
        s = length[name]
        one, call = min(times[name, 1]), min(times[name, s])
        seconds = sorted(xla.get(name, [float("nan")]))
        out[name] = (1e3 * max(call - one, 0.0) / (s - 1), first[name] - call,
                     (seconds[0], seconds[len(seconds) // 2]))  # fmt: skip
    return out


COLUMNS = ["hand-written", "eqxprob", "GPJax 1.0", "numpyro svi.update in jit(scan)",
           "numpyro svi.run"]  # fmt: skip


def problems(small: bool) -> list[tuple[str, Callable[[], dict[str, Run]], int]]:
    """(name, its variants' maker, S) of each row: CPU sizes if `small`, else the
    GPU sizes of issue #28."""
    big = 5_000 if small else 1_000_000
    svgp_sizes = [(16, 256), (32, 256), (16, 1024)] if small else [
        (128, 1024), (512, 1024), (128, 8192)]  # fmt: skip
    out = [
        (f"SVGP, N = {big:,}, M = {m}, batch {b}", lambda m=m, b=b: svgp_variants(
            big, m, b), 4000 if small else 1024)
        for m, b in svgp_sizes
    ]  # fmt: skip
    for n in (128, 256) if small else (4096, 16384):
        steps = (1000 if n <= 128 else 400) if small else (50 if n <= 4096 else 10)
        out.append((f"exact GP, n = {n}", lambda n=n: gp_variants(n), steps))
    d, b = (64, 1024) if small else (64, 4096)
    out.append((
        f"mean-field VI, logistic regression, N = {big:,}, D = {d}, batch {b}",
        lambda: vi_variants(big, d, b), 16_000 if small else 1024,
    ))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CPU sizes, few steps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--compiles", type=int, help="fresh compiles a row (3 with --small, else 1)"
    )
    parser.add_argument("--steps", type=int, help="S for every problem")
    parser.add_argument("--only", default="", help="problems whose name has this")
    args = parser.parse_args()
    small = args.small
    args.compiles = args.compiles or (3 if small else 1)  # (a GPU compile: seconds)
    rows, compile_rows, xla_rows, lengths = [], [], [], []
    for name, make, steps in problems(small):
        if args.only not in name:
            continue
        steps = args.steps or steps
        lengths.append(str(steps))
        result = measure(make(), steps, args.rounds, args.compiles)
        hand = result["hand-written"][0]
        cells = [
            "–" if c not in result else
            f"{result[c][0]:.4g}" + ("" if c == "hand-written" or hand <= 0 else
                                     f" ({result[c][0] / hand:.2f})")
            for c in COLUMNS
        ]  # fmt: skip
        rows.append([name, *cells])
        compile_rows.append(
            [
                name,
                *("–" if c not in result else f"{result[c][1]:.2f}" for c in COLUMNS),
            ]
        )
        ours, hand_s = result["eqxprob"][2], result["hand-written"][2]
        xla_rows.append(
            [
                name,
                *(f"{result[c][2][0]:.3f} ({result[c][2][1]:.3f})" for c in COMPILED),
                f"{ours[0] / hand_s[0]:.3f} ({ours[1] / hand_s[1]:.3f})",
            ]
        )
        print(f"  done: {name}", file=sys.stderr, flush=True)
    device = jax.devices()[0]
    print(
        f"ms per step (ratio to hand-written), float32, jax {jax.__version__}, "
        f"{device.platform} {device.device_kind}; S steps less one step, min of "
        f"{args.rounds} rounds; S = {', '.join(lengths)}"
    )
    print(table(["problem", *COLUMNS], rows))
    print("\ncompile s (a first call minus a warm one)")
    print(table(["problem", *COLUMNS], compile_rows))
    print(
        f"\nXLA compile s of the steps' program, min (median) of {args.compiles} fresh "
        "compiles (JAX's backend compile events)"
    )
    print(table(["problem", *COMPILED, "eqxprob / hand-written"], xla_rows))


if __name__ == "__main__":
    main()
