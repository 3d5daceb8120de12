"""Variational inference for any Equinox model whose parameters carry priors.

`guide(model)` builds a Gaussian over the **unconstrained** coordinates of the
model's random parameters: every trainable float leaf whose spec (`ep.field`
metadata and/or where-overrides) has a `prior`. Leaves without a prior stay point
estimates that train along with the guide (type-II maximum likelihood), frozen
ones (`trainable=False`) stay fixed; neither is dropped. `elbo` is the
reparameterised evidence lower bound that `ep.fit` trains.

Everything goes through the registry's one mechanism: `unconstrain` to build the
guide, `constrain` and the transform adapter's log-det to draw models, the
registry's prior scoring (with its support and shape checks) for the prior term.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from . import _errors, _families, _metadata, _parameter, _transforms
from ._where import WhereDict
from ._wrappers import FixedDistrax


class _Slot(eqx.Module):
    """Where a random parameter goes in the guide's template (no array inside)."""

    shape: tuple[int, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)


class _Held(_parameter.Frozen):
    """A frozen (trainable=False) parameter kept unconstrained in the template."""


def _is_template_leaf(x: Any) -> bool:
    return isinstance(x, _Slot) or _parameter.is_node(x)


class _Random(NamedTuple):
    """Where one random parameter lives: its path (for messages), its position
    among the template's items and in the flat unconstrained vector, its shape.
    Its prior and transform are read from the model's specs where used."""

    label: str
    item: int
    start: int
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"random({self.label}, shape={self.shape})"


class Guide(eqx.Module):
    """A Gaussian variational distribution over a model's random parameters.

    Built by `ep.guide`. Its arrays are the variational parameters (`loc` and a
    family-specific scale, as `ep.Bijector` nodes) and the model's point estimates;
    it trains with `ep.fit`, serialises and shards like any model.

    - `sample(key, n)`: `n` models drawn from the guide, stacked along a leading
      axis of every random leaf, constrained, with the model's structure.
    - `mean()`: the model at the guide's location (its median in constrained
      space, since the transforms are monotone per coordinate).
    - `log_prob(model)`: the guide's log-density of a model's unconstrained
      random parameters (w.r.t. Lebesgue measure on the unconstrained space).
    - `distribution`: the guide as a wrapped distrax multivariate normal.

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    class Rate(eqx.Module):
        rate: jax.Array = ep.field(
            constraint=ep.constraints.positive, prior=distrax.Gamma(2.0, 1.0)
        )

    q = ep.guide(Rate(jnp.array(1.5)))
    draws = q.sample(jax.random.key(0), 100)
    assert draws.rate.shape == (100,) and bool(jnp.all(draws.rate > 0))
    assert jnp.allclose(q.mean().rate, 1.5)
    ```
    """

    # The template holds unconstrained values where the model's fields are
    # constrained: `ep.fit` must not ask for `ep.parameterize` there.
    unconstrained_inside = True

    template: PyTree
    loc: Float[Array, " d"]
    scale: Any
    family: str = eqx.field(static=True)
    randoms: tuple[_Random, ...] = eqx.field(static=True)
    overrides: Any = eqx.field(static=True)

    @property
    def distribution(self) -> FixedDistrax:
        """The guide over the flat unconstrained vector, as a `FixedDistrax`."""
        scale = _parameter.resolve(self.scale)
        if self.family == "mean_field":
            return FixedDistrax(distrax.MultivariateNormalDiag, self.loc, scale)
        if self.family == "full_rank":
            return FixedDistrax(distrax.MultivariateNormalTri, self.loc, scale)
        return FixedDistrax(distrax.MultivariateNormalDiagPlusLowRank, self.loc, *scale)

    def _split(self, u: Array) -> list[Array]:
        """The random parameters' arrays in the flat vector `u`."""
        return [
            u[r.start : r.start + math.prod(r.shape)].reshape(r.shape)
            for r in self.randoms
        ]

    def _fill(self, values: list) -> PyTree:
        """The template with `values` in the random parameters' slots and the
        frozen ones' values (without gradient), in unconstrained space."""
        leaves, treedef = jtu.tree_flatten(self.template, is_leaf=_is_template_leaf)
        leaves = [x.unwrap() if isinstance(x, _Held) else x for x in leaves]
        for r, value in zip(self.randoms, values):
            leaves[r.item] = value
        return jtu.tree_unflatten(treedef, leaves)

    def _assemble(self, u: Array) -> PyTree:
        """The constrained model at the flat unconstrained vector `u`."""
        return _metadata.constrain(self._fill(self._split(u)), self.overrides)

    def _specs(self) -> list:
        """`(prior, transform)` of each random parameter, from the model's
        field metadata and the overrides."""
        items, _ = _metadata.entries(self._fill(self._split(self.loc)), self.overrides)
        specs = [items[r.item][1] for r in self.randoms]
        return [(spec.prior, spec.transform()) for spec in specs]

    def _log_det(self, u: Array) -> Array:
        parts = zip(self.randoms, self._specs(), self._split(u))
        terms = (jnp.sum(_transforms.log_det(t, x, r.label)) for r, (_, t), x in parts)
        return sum(terms, jnp.zeros((), u.dtype))

    def _log_prior(self, model: PyTree, analytic: bool) -> Array:
        """The random parameters' log prior at `model` (Gaussian ones left out
        when `analytic`: their expectation is added in closed form)."""
        values = jtu.tree_leaves(model, is_leaf=_parameter.is_node)
        total = jnp.zeros(())
        for r, (prior, transform) in zip(self.randoms, self._specs()):
            if not (analytic and _gaussian_prior(prior, transform) is not None):
                total = total + _metadata.score_prior(r.label, prior, values[r.item])
        return total

    def _expected_gaussian_log_prior(self) -> Array:
        """E_q[log p(u)] in closed form for Normal priors on identity leaves."""
        total = jnp.zeros(())
        variances = self._split(self.distribution.variance())
        parts = zip(self.randoms, self._specs(), self._split(self.loc), variances)
        for r, specs, m, v in parts:
            if (gaussian := _gaussian_prior(*specs)) is not None:
                mu, var = gaussian[0], gaussian[1] ** 2
                squared = (m - mu) ** 2 + v
                terms = -0.5 * jnp.log(2 * jnp.pi * var) - squared / (2 * var)
                total = total + jnp.sum(jnp.broadcast_to(terms, r.shape))
        return total

    def sample(self, key: PRNGKeyArray, n: int) -> PyTree:
        """`n` models drawn from the guide, stacked along a leading axis."""
        u = self.distribution.sample(seed=key, sample_shape=(n,))
        return jax.vmap(self._assemble)(u)

    def mean(self) -> PyTree:
        """The model at the guide's location."""
        return self._assemble(self.loc)

    def log_prob(self, model: PyTree) -> Float[Array, ""]:
        """log q of `model`'s unconstrained random parameters."""
        raw = _metadata.unconstrain(model, self.overrides)
        leaves = jtu.tree_leaves(raw, is_leaf=_parameter.is_node)
        for r in self.randoms:
            if (shape := jnp.shape(leaves[r.item])) != r.shape:
                raise ValueError(
                    f"Guide.log_prob: `{r.label}` has shape {shape}, not {r.shape}. "
                    "Pass one model; for draws, `jax.vmap(guide.log_prob)(draws)`."
                )
        u = jnp.concatenate([jnp.ravel(leaves[r.item]) for r in self.randoms])
        return self.distribution.log_prob(u)


def _gaussian_prior(prior: Any, transform: Any) -> tuple | None:
    """`(loc, scale)` of a prior of one of the libraries' own univariate Normal
    classes (wrapped or raw; a subclass may override `log_prob`) on an
    identity-transformed leaf, else `None`."""
    if not isinstance(transform, _transforms.Identity):
        return None
    gaussian = _families.normal_parameters(prior)
    return None if gaussian is None else tuple(map(jnp.asarray, gaussian))


def _check_unconstrained(label: str, prior: Any, value: Array) -> None:
    """Raise if `prior` gives -inf on the real line that an unconstrained
    parameter's samples range over: probed either side of its value, beyond."""
    if _errors.is_traced(value):
        return
    if jnp.finfo(value.dtype).bits < 32:  # (half precision: probed in float32)
        value = value.astype(jnp.float32)
    for probe in (value - jnp.abs(value) - 1, value + jnp.abs(value) + 1):
        lp = _metadata.score_prior(label, prior, probe)
        if not _errors.is_traced(lp) and not bool(jnp.isfinite(lp)):
            raise ValueError(
                f"guide: `{label}` has no constraint, so the guide's samples of it "
                f"range over the real line, but its prior {type(prior).__name__} is "
                f"-inf on part of it (at {probe}). Give the field the constraint of "
                "the prior's support, e.g. `ep.field(constraint=ep.constraints."
                "positive, prior=...)`."
            )


def guide(
    model: PyTree,
    family: Literal["mean_field", "full_rank", "low_rank"] = "mean_field",
    *,
    overrides: Any = None,
    init_scale: float = 0.1,
    rank: int = 2,
) -> Guide:
    """A Gaussian variational guide over the unconstrained parameters of `model`.

    Random parameters are the trainable float leaves with a prior (from `ep.field`
    metadata and/or `overrides`); they are flattened into one vector `u` (in leaf
    order) and the guide is `q(u) = N(loc, S Sᵀ)`:

    - `"mean_field"`: `S` diagonal, an `ep.positive` vector;
    - `"full_rank"`: `S` lower-triangular, an `ep.lower_cholesky` matrix;
    - `"low_rank"`: `S = diag(d) + U Vᵀ` with `d` positive and `U`, `V` of `rank`
      columns (started small, not zero: zero is a stationary point).

    `loc` starts at the model's current (unconstrained) values, the scale at
    `init_scale`. Leaves without a prior are point estimates, trained with the
    guide; frozen leaves (`trainable=False`) stay fixed. A model holding
    `ep.Bijector` nodes keeps them as point estimates; declare random parameters
    with `ep.field` metadata on plain arrays. The guide keeps every constrained
    field in unconstrained space itself (the model is not `ep.parameterize`d
    first), so `ep.fit` trains it inside the supports.

    **Arguments:**

    - `model`: an Equinox model (any PyTree) with prior metadata.
    - `family`: `"mean_field"`, `"full_rank"` or `"low_rank"`.
    - `overrides`: optional `{where: ep.ParamSpec}`, as for `ep.spec_tree`.
    - `init_scale`: the initial standard deviation in unconstrained space.
    - `rank`: the number of low-rank columns (`"low_rank"` only).

    **Raises:**

    `ValueError` if no parameter has a prior, a parameter is outside its
    constraint or its prior's support, or a field without a constraint has a
    prior that is `-inf` on part of the real line (give it the constraint of the
    prior's support); `TypeError` for an unknown family.

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    class Line(eqx.Module):
        slope: jax.Array = ep.field(prior=distrax.Normal(0.0, 1.0))
        noise: jax.Array = ep.field(constraint=ep.constraints.positive)

    q = ep.guide(Line(jnp.zeros(2), jnp.array(0.5)), "full_rank")
    assert q.loc.shape == (2,) and ep.resolve(q.scale).shape == (2, 2)
    ```
    """
    if family not in ("mean_field", "full_rank", "low_rank"):
        raise TypeError(
            f"guide: `family` must be 'mean_field', 'full_rank' or 'low_rank', got "
            f"{family!r}."
        )
    try:
        init_scale = float(init_scale)
    except (TypeError, ValueError):
        raise TypeError(
            f"guide: `init_scale` must be a positive number, got {init_scale!r}."
        ) from None
    if not (0 < init_scale < np.inf):
        raise ValueError(f"guide: `init_scale` must be > 0, got {init_scale!r}.")
    if family == "low_rank" and (
        isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1
    ):
        raise ValueError(f"guide: `rank` must be a positive integer, got {rank!r}.")
    raw = _metadata.unconstrain(model, overrides)
    items, treedef = _metadata.entries(model, overrides)
    raw_items = jtu.tree_leaves(raw, is_leaf=_parameter.is_node)
    leaves, randoms, pieces = [], [], []
    for index, ((path, spec, item), value) in enumerate(zip(items, raw_items)):
        label = _metadata.label_of(path)
        prior = None if spec is None or not spec.is_trainable else spec.prior
        if prior is not None and not _parameter.is_node(item):
            _metadata.check_trained(label, item, "a prior")
        if prior is not None and eqx.is_inexact_array(item):  # a random parameter
            value = jnp.asarray(value)
            start = sum(piece.size for piece in pieces)
            randoms.append(_Random(label, index, start, value.shape))
            start_lp = _metadata.score_prior(label, prior, item)
            if not _errors.is_traced(start_lp) and not bool(jnp.isfinite(start_lp)):
                raise ValueError(
                    f"guide: the value of `{label}` is outside the support of its "
                    f"prior {type(prior).__name__} (log prior {start_lp}). Start it "
                    "inside, with the matching constraint so that samples stay inside."
                )
            if spec is not None and isinstance(spec.transform(), _transforms.Identity):
                _check_unconstrained(label, prior, value)
            pieces.append(jnp.ravel(value))
            leaves.append(_Slot(value.shape, value.dtype))
        else:
            held = spec is not None and not spec.is_trainable and eqx.is_array(value)
            leaves.append(_Held(value) if held else value)
    if not randoms:
        raise ValueError(
            "guide: no parameter of the model has a prior. Declare priors with "
            "`ep.field(prior=...)` or overrides `{where: ep.ParamSpec(prior=...)}`."
        )
    loc = _errors.as_float(jnp.concatenate(pieces), "guide")
    d, dtype = loc.shape[0], loc.dtype
    if family == "mean_field":
        scale = _parameter.positive(jnp.full((d,), init_scale, dtype))
    elif family == "full_rank":
        scale = _parameter.lower_cholesky(init_scale * jnp.eye(d, dtype=dtype))
    else:
        small = 0.1 * init_scale * jnp.eye(d, min(int(rank), d), dtype=dtype)
        scale = (_parameter.positive(jnp.full((d,), init_scale, dtype)), small, small)
    # A static value (specs hash by identity) that every registry function takes.
    frozen = None if overrides is None else tuple(WhereDict(overrides).items())
    template = jtu.tree_unflatten(treedef, leaves)
    return Guide(template, loc, scale, family, tuple(randoms), frozen)


def elbo(
    guide: Guide,
    log_likelihood: Callable[[PyTree], Float[Array, ""]],
    key: PRNGKeyArray,
    *,
    num_samples: int = 1,
    likelihood_scale: float | Float[Array, ""] = 1.0,
    analytic: bool = True,
) -> Float[Array, ""]:
    """A reparameterised estimate of the evidence lower bound.

    `E_q[s · log p(data | θ) + log p(θ) + log|det J(u)|] + H[q]`, with `θ` the
    constrained model at unconstrained `u ~ q`, `J` the Jacobian of the registry's
    bijectors (w.r.t. each support's own measure) and `H[q]` the guide's analytic
    entropy. With `analytic=True`, a Normal prior on an unconstrained (identity)
    leaf contributes its expectation in closed form rather than by sampling (so a
    Gaussian prior and guide give the analytic `-KL`), which lowers the variance.

    **Minibatches:** with a batch of `b` of `N` rows, pass `likelihood_scale=N / b`:
    with rows drawn uniformly (as `ep.fit` does) the estimate is unbiased for the
    full-data ELBO.

    **Arguments:**

    - `guide`: from `ep.guide`.
    - `log_likelihood`: `log_likelihood(model) -> scalar`, on one model (it is
      `vmap`ped over the samples).
    - `key`: a PRNG key (in `ep.fit`, take it as the loss's `key` parameter).
    - `num_samples`: Monte Carlo samples.
    - `likelihood_scale`: `s` above.
    - `analytic`: use closed forms where they exist.

    **Returns:**

    A scalar (maximise it; `ep.fit` minimises, so return `-ep.elbo(...)`).

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
    import eqxprob as ep

    y = jnp.array([0.9, 1.4, 1.1])

    class Mean(eqx.Module):
        mu: jax.Array = ep.field(prior=distrax.Normal(0.0, 10.0))

    def loss(q, key):
        loglik = lambda m: jnp.sum(distrax.Normal(m.mu, 1.0).log_prob(y))
        return -ep.elbo(q, loglik, key, num_samples=8)

    q, _ = ep.fit(ep.guide(Mean(jnp.array(0.0))), loss, optimiser=optax.adam(0.05),
                  steps=1000, key=jax.random.key(0), progress=False)
    assert abs(q.loc[0] - 1.13) < 0.05  # posterior mean: sum(y) / (3 + 1e-2)
    ```
    """
    if not isinstance(guide, Guide):
        raise TypeError(
            f"elbo: `guide` must come from `ep.guide`, got {type(guide).__name__}."
        )
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(f"elbo: `num_samples` must be an int, got {num_samples!r}.")
    if num_samples < 1:
        raise ValueError(f"elbo: `num_samples` must be >= 1, got {num_samples}.")
    u = guide.distribution.sample(seed=key, sample_shape=(num_samples,))

    def one(u: Array) -> Array:
        model = guide._assemble(u)
        ll = log_likelihood(model)
        if ll is None or jnp.iscomplexobj(ll) or jnp.result_type(ll) == jnp.bool_:
            raise TypeError(
                f"elbo: `log_likelihood(model)` must return a real scalar, got {ll!r}."
            )
        if jnp.shape(ll) != ():
            raise TypeError(
                f"elbo: `log_likelihood(model)` must return a scalar, got shape "
                f"{jnp.shape(ll)}. Sum over the data."
            )
        log_prior = guide._log_prior(model, analytic)
        return likelihood_scale * ll + log_prior + guide._log_det(u)

    # One sample: no `vmap` (XLA's batched matmul of a batch of one costs twice
    # the plain one on CPU).
    expected = one(u[0]) if num_samples == 1 else jnp.mean(jax.vmap(one)(u))
    if analytic:
        expected = expected + guide._expected_gaussian_log_prior()
    return expected + guide.distribution.entropy()
