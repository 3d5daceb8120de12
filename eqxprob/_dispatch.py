"""The libraries' own dispatch taught to take wrappers.

numpyro's `kl_divergence` (multipledispatch) and `vmap_over` (singledispatch), and
TFP's KL registry (which distrax's `kl_divergence` reads too), get entries for
`FixedDistrax` in each argument position. A wrapper stands for the object it
builds, so the library's own rule for the pair runs; a pair across numpyro and
distrax/TFP, whose registries do not know each other's classes, raises a
`TypeError` naming both. numpyro's entries are made when eqxprob first imports
numpyro (it imports numpyro only when a numpyro class is used).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import distrax
from tensorflow_probability.substrates import jax as tfp

from . import _families
from ._wrappers import FixedDistrax, built, check_kl


def _kl(method: str, kl: Any, p: Any, q: Any) -> Any:
    """`kl(p, q)` on the objects the wrappers among `p`, `q` build."""
    wrapper, other = (p, q) if isinstance(p, FixedDistrax) else (q, p)
    check_kl(wrapper, method, other)
    return kl(built(p), built(q))


def _tfp_kl(p: Any, q: Any, name: Any = None) -> Any:
    return _kl("kl_divergence", tfp.distributions.kl_divergence, p, q)


for _pair in [(FixedDistrax, FixedDistrax)] + [
    pair
    for raw in (tfp.distributions.Distribution, distrax.Distribution)
    for pair in ((FixedDistrax, raw), (raw, FixedDistrax))
]:
    tfp.distributions.RegisterKL(*_pair)(_tfp_kl)


def _vmap_over(wrapper: FixedDistrax, **axes: Any) -> FixedDistrax:
    """numpyro's `vmap_over(d, loc=0, ...)`: the `in_axes` of `wrapper` for
    `jax.vmap`, its array arguments named in `axes` mapped, the rest `None`."""
    arguments = wrapper.arguments
    fields = [name for name, value in arguments.items() if name in vars(wrapper)]
    unknown = sorted(set(axes) - set(fields))
    if any(axes[name] is not None for name in unknown):
        raise TypeError(
            f"vmap_over(FixedDistrax({wrapper.cls.__name__}), ...): "
            f"{', '.join(unknown)} not among its array arguments ({', '.join(fields)})."
        )
    spec = {name: axes.get(name) for name in fields}
    static = {n: v for n, v in arguments.items() if n not in spec}
    return FixedDistrax.spec(wrapper.cls, static_arguments=static, **spec)


def _register_numpyro(_: Any) -> None:
    kl = importlib.import_module("numpyro.distributions.kl").kl_divergence
    batch_util = importlib.import_module("numpyro.distributions.batch_util")
    # (Any other side: `_kl` names a raw distrax or TFP one's family.)
    for pair in (
        (FixedDistrax, FixedDistrax),
        (FixedDistrax, object),
        (object, FixedDistrax),
    ):
        kl.add(pair, lambda p, q, kl=kl: _kl("kl_divergence", kl, p, q))
    batch_util.vmap_over.register(FixedDistrax, _vmap_over)


_families.ON_NUMPYRO.append(_register_numpyro)
if "numpyro.distributions" in sys.modules:  # (imported before eqxprob)
    _families.require_numpyro()
