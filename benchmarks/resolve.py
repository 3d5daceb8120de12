"""`ep.resolve`: trace time and compiled size, against the same loss on raw arrays.

Run: `python benchmarks/resolve.py`. Prints a table; asserts nothing about time.

The model is a list of `n` positive scalars (`ep.positive`), resolved by
`ep.resolve` at the top of the loss. The baseline is the same loss written by hand
on the raw unconstrained arrays with `jax.nn.softplus`. For each `n`:

- trace: median time of `jax.make_jaxpr(loss)` (Python overhead of `resolve`);
- ops: instructions in the optimised HLO of `jax.jit(loss)` and of
  `jax.jit(jax.grad(loss))`, counted in `.lower(...).compile().as_text()`. The
  target is equal counts: `resolve` costs nothing after compilation. (XLA takes
  ~8 ms per scalar parameter to compile the loss and ~40 ms for its gradient on
  a 2-core machine, so the gradient is compiled up to `GRAD_SIZES` only; the
  whole script runs for about four minutes.)

A third column traces the same model with `ep.FixedDistrax(tfb.Softplus)` as the
transform (the TFP bijector, built afresh at every call), which is why the
shortcuts use small pure-JAX bijectors instead.
"""

import re
import statistics
import time

import jax
import jax.numpy as jnp
from tensorflow_probability.substrates import jax as tfp

import eqxprob as ep


SIZES = (1, 100, 10_000)
GRAD_SIZES = (1, 100)
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+ = ", re.MULTILINE)


def loss(model):
    values = ep.resolve(model)
    return jnp.sum(jnp.stack(values) ** 2)


def loss_raw(params):
    values = [jax.nn.softplus(p) for p in params]
    return jnp.sum(jnp.stack(values) ** 2)


def trace_time(f, *args, repeats):
    times = []
    for _ in range(repeats):

        def fresh(*args):  # JAX caches traces per function object: defeat that
            return f(*args)

        start = time.perf_counter()
        jax.make_jaxpr(fresh)(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hlo_ops(f, *args):
    text = jax.jit(f).lower(*args).compile().as_text()
    return len(_INSTRUCTION.findall(text))


def main():
    softplus = ep.FixedDistrax(tfp.bijectors.Softplus)
    header = (
        f"{'n':>6} | {'trace resolve':>13} | {'trace raw':>9} | {'ratio':>5} | "
        f"{'trace TFP':>9} | {'ops resolve':>11} | {'ops raw':>7} | "
        f"{'grad ops resolve':>16} | {'grad ops raw':>12}"
    )
    print(header)
    print("-" * len(header))
    for n in SIZES:
        model = [ep.positive(1.0 + (i % 7)) for i in range(n)]
        params = [b.param for b in model]
        with_tfp = [ep.Bijector(p, softplus) for p in params]
        repeats = 5 if n < 10_000 else 1
        t_resolve = trace_time(loss, model, repeats=repeats)
        t_raw = trace_time(loss_raw, params, repeats=repeats)
        t_tfp = trace_time(loss, with_tfp, repeats=repeats)
        ops = hlo_ops(loss, model), hlo_ops(loss_raw, params)
        grad_ops = ("-", "-")
        if n in GRAD_SIZES:
            grad_ops = (
                hlo_ops(jax.grad(loss), model),
                hlo_ops(jax.grad(loss_raw), params),
            )
        print(
            f"{n:>6} | {t_resolve * 1e3:>10.1f} ms | {t_raw * 1e3:>6.1f} ms | "
            f"{t_resolve / t_raw:>5.2f} | {t_tfp * 1e3:>6.0f} ms | {ops[0]:>11} | "
            f"{ops[1]:>7} | {grad_ops[0]:>16} | {grad_ops[1]:>12}",
            flush=True,
        )


if __name__ == "__main__":
    main()
