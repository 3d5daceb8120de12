"""`natural_gradient`: natural-gradient steps on the Gaussians of any model.

Its one idea (Salimbeni, Eleftheriadis & Hensman, AISTATS 2018, as GPJax 1.0's
`fit_natgrads` does it): for a Gaussian `q = N(m, S)` the natural gradient with
respect to the natural parameters `θ = (S⁻¹m, -½S⁻¹)` is the ordinary gradient
with respect to the expectation parameters `η = (m, S + mmᵀ)`, so a step
`θ ← θ - γ ∂ℓ/∂η` needs no Fisher matrix. Each step, in GPJax's order:

1. `∂ℓ/∂(m, L)` from the gradient `ep.fit` took w.r.t. the raw parameters,
   pulled back through each leaf's own transform (`ep.lower_cholesky`,
   `ep.positive`: the inverse's vector-Jacobian product, exact by the chain
   rule), then `G_S = sym(L⁻ᵀ Φ(Lᵀ ḡ_L) L⁻¹)` (the Cholesky backward formula,
   Murray 2016), `∂ℓ/∂η₂ = G_S`, `∂ℓ/∂η₁ = g_m - 2 G_S m`;
2. the step, with step sizes `γ·backoff^k` (`k = 0 .. max_backoff`) tried at
   once and the first whose precision is positive definite taken (none: NaN,
   as GPJax, which `ep.fit` reports naming the leaves; no host callback in the
   step, which would make `ep.fit` compile at every call);
3. back to the leaf's own parameterisation (the transform's inverse);
4. the other trainable leaves take one step of `optimiser` with the gradient at
   the updated `q` (one more gradient).

Which leaves are Gaussians is decided by class identity through the family
adapter (`_families.gaussian_layout`) and, for `ep.guide`'s guides, by their
family.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple, SupportsIndex

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optax
from jaxtyping import Array, ArrayLike, PyTree

from . import _transforms
from ._errors import is_traced
from ._families import gaussian_layout
from ._metadata import label_of
from ._parameter import Bijector, Frozen
from ._variational import Guide
from ._where import where_labels, where_paths
from ._wrappers import FixedDistrax


class NaturalGradientState(NamedTuple):
    """The state of `ep.natural_gradient`: the step number (for a schedule) and
    the state of the optimiser of the other parameters."""

    step: Array
    inner: Any


class _Slot(NamedTuple):
    """One parameter of a Gaussian: its label, its position among the
    parameters' leaves and its transform (`None` for a plain array)."""

    label: str
    leaf: int
    transform: Any


class _Site(NamedTuple):
    """One Gaussian: `kind` is `"tri"` (a lower Cholesky factor) or `"diag"`
    (standard deviations, elementwise with the location)."""

    label: str
    kind: str
    loc: _Slot
    scale: _Slot


def _is_candidate(x: Any) -> bool:
    return isinstance(x, (FixedDistrax, Guide))


def _is_key_path(x: Any) -> bool:
    keys = (jtu.GetAttrKey, jtu.DictKey, jtu.SequenceKey, jtu.FlattenedIndexKey)
    return isinstance(x, tuple) and all(isinstance(k, keys) for k in x)


def _describe(node: Any) -> str:
    if isinstance(node, FixedDistrax):
        return f"a wrapped {node.cls.__name__}"
    if node is None:
        return "None (nothing trainable)"
    return "an array" if eqx.is_array(node) else f"a {type(node).__name__}"


_GAUSSIANS = (
    "wrapped MultivariateNormalTri / MultivariateNormalDiag / Normal of distrax, "
    "MultivariateNormalTriL / MultivariateNormalDiag / Normal of TFP, "
    "MultivariateNormal(scale_tril=...) / Normal of numpyro, and `ep.guide`'s "
    "'mean_field' and 'full_rank' guides"
)


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def _sites(params: PyTree, where: Any) -> list[_Site]:
    """The Gaussians of `params` (the trainable partition of a model) that
    `where` selects (all of them, outside other wrappers, if `None`)."""
    flat = jtu.tree_flatten_with_path(params)[0]
    positions = {path: i for i, (path, _) in enumerate(flat)}
    if where is None:
        found = jtu.tree_flatten_with_path(params, is_leaf=_is_candidate)[0]
        selected = [
            (path, node)
            for path, node in found
            if (
                isinstance(node, Guide)
                or (isinstance(node, FixedDistrax) and gaussian_layout(node.cls))
            )
            and jtu.tree_leaves(node)  # (a frozen one: no trained leaf here)
        ]
        if len(selected) != 1:
            names = ", ".join(f"`{label_of(path)}`" for path, _ in selected)
            raise ValueError(
                f"natural_gradient: the model holds {len(selected)} trained "
                f"Gaussians at its top level ({names or 'none'}); without `where=` "
                "it updates one. Select the variational ones, e.g. `where=lambda m: "
                "m.q` or `where=lambda m: (m.q1, m.q2)`: a Gaussian that is a "
                "likelihood or a prior is no variational distribution. (It "
                f"updates {_GAUSSIANS}; a Gaussian inside another wrapper only "
                "when `where=` selects it.)"
            )
    else:
        # (the selections, as `where` returns them, beside their key paths)
        paths, shape = jtu.tree_flatten(
            where_paths(where, params), is_leaf=_is_key_path
        )
        nodes = dict(zip(paths, shape.flatten_up_to(where(params))))
        selected = list(nodes.items())  # (in order, once each)
    return [_site(path, node, positions) for path, node in selected]


def _site(path: tuple, node: Any, positions: dict) -> _Site:
    label = label_of(path)
    if isinstance(node, Guide):
        if node.family == "low_rank":
            raise ValueError(
                f"natural_gradient: `{label}` is a 'low_rank' guide, whose family "
                "(diagonal plus low rank) is not closed under the natural-parameter "
                "step: the precision S⁻¹ changes by a full-rank matrix, so no "
                "diagonal-plus-low-rank covariance matches the updated q. Use "
                "`ep.guide(model, 'full_rank')` (or 'mean_field'), or leave the "
                "guide out with `where=`."
            )
        kind = "diag" if node.family == "mean_field" else "tri"
        loc, scale = ("loc", node.loc), ("scale", node.scale)
    elif isinstance(node, FixedDistrax) and (layout := gaussian_layout(node.cls)):
        arguments = node.arguments
        for name, value in layout.requires:
            if not _same(arguments.get(name, value), value):
                raise ValueError(
                    f"natural_gradient: `{label}` is a wrapped {node.cls.__name__} "
                    f"with `{name}` given; natural gradients update it only in "
                    f"its `{layout.loc}`, `{layout.scale}` form (`{name}={value}`)."
                )
        kind = layout.kind
        loc = (layout.loc, arguments.get(layout.loc))
        scale = (layout.scale, arguments.get(layout.scale))
    else:
        raise TypeError(
            f"natural_gradient: `where` selects `{label}`, {_describe(node)}, which "
            f"is not a Gaussian it can update. It updates {_GAUSSIANS}; select "
            "those (other leaves take `optimiser`'s steps)."
        )
    slots = [_slot(label, path, name, value, positions) for name, value in (loc, scale)]
    return _Site(label, kind, *slots)


def _slot(site: str, path: tuple, name: str, value: Any, positions: dict) -> _Slot:
    path = (*path, jtu.GetAttrKey(name))
    label = label_of(path)
    if eqx.is_inexact_array(value):
        return _Slot(label, positions[path], None)
    if isinstance(value, Bijector) and eqx.is_inexact_array(value.param):
        holes = jtu.tree_leaves(value.transform, is_leaf=lambda x: x is None)
        if any(x is None for x in holes):
            raise ValueError(
                f"natural_gradient: the transform of `{label}` holds arrays that "
                "are not trained (so not among the parameters it sees). Use a "
                "transform without arrays, e.g. `ep.lower_cholesky` for a Cholesky "
                "factor or `ep.positive` for standard deviations."
            )
        if not _transforms.has_inverse(value.transform):
            raise TypeError(
                f"natural_gradient: the transform of `{label}` has no inverse, so "
                "the updated value cannot be written back. Use `ep.lower_cholesky` "
                "or `ep.positive`, or a bijector with an inverse."
            )
        return _Slot(
            label, positions[(*path, jtu.GetAttrKey("param"))], value.transform
        )
    if value is None:
        why = "missing or not trained (not a float array)"
    elif isinstance(value, Frozen):
        why = "frozen (`ep.frozen`), so not trained"
    else:
        why = f"a {type(value).__name__}, not an array or an `ep.Bijector` of one"
    raise ValueError(
        f"natural_gradient: `{label}` of the Gaussian `{site}` is {why}. Natural "
        "gradients update its location and scale together: both must be trained "
        "arrays (or `ep.Bijector`s of arrays), or leave it out with `where=`."
    )


# --------------------------------------------------------------------- the maths


def _value(slot: _Slot, raw: Array) -> Array:
    return raw if slot.transform is None else _transforms.forward(slot.transform, raw)


def _raw(slot: _Slot, value: Array) -> Array:
    if slot.transform is None:
        return value
    return _transforms.inverse(slot.transform, value, "natural_gradient")


def _pull_back(slot: _Slot, value: Array, grad: Array) -> Array:
    """∂ℓ/∂value from ∂ℓ/∂raw: the vector-Jacobian product of the inverse."""
    if slot.transform is None:
        return grad
    return jax.vjp(lambda v: _raw(slot, v), value)[1](grad)[0]


def _sym(a: Array) -> Array:
    return 0.5 * (a + jnp.swapaxes(a, -1, -2))


def _lower_solve(lower: Array, rhs: Array) -> Array:
    return jax.scipy.linalg.solve_triangular(lower, rhs, lower=True)


def _upper_solve(upper: Array, rhs: Array) -> Array:
    return jax.scipy.linalg.solve_triangular(upper, rhs, lower=False)


def _tri_gradient(m: Array, lower: Array, g_m: Array, g_lower: Array) -> tuple:
    """`θ` and `∂ℓ/∂η` of one Gaussian `N(m, L Lᵀ)` from `∂ℓ/∂m`, `∂ℓ/∂L`."""
    lower = jnp.tril(lower)  # (what the libraries read of a factor: its lower part)
    eye = jnp.eye(m.shape[-1], dtype=m.dtype)
    inverse = _lower_solve(lower, eye)
    precision = inverse.T @ inverse
    product = lower.T @ jnp.tril(g_lower)
    phi = jnp.tril(product) - 0.5 * jnp.diag(jnp.diag(product))
    g_cov = _sym(inverse.T @ phi @ inverse)
    return (precision @ m, -0.5 * precision), (g_m - 2.0 * g_cov @ m, g_cov)


def _tri_admissible(theta: tuple, grad: tuple, rate: Array) -> Array:
    """Whether the step of size `rate` keeps the precision positive definite."""
    root = jnp.linalg.cholesky(_sym(-2.0 * (theta[1] - rate * grad[1])))
    mean = _upper_solve(root.T, _lower_solve(root, theta[0] - rate * grad[0]))
    return jnp.all(jnp.isfinite(root)) & jnp.all(jnp.isfinite(mean))


def _tri_moments(theta: tuple, grad: tuple, rate: Array) -> tuple[Array, Array]:
    """`(m, L)` after the step of size `rate` (GPJax's `moments_from_natural`)."""
    vector, matrix = theta[0] - rate * grad[0], theta[1] - rate * grad[1]
    eye = jnp.eye(vector.shape[-1], dtype=vector.dtype)
    root = jnp.linalg.cholesky(_sym(-2.0 * matrix))
    root_inverse = _lower_solve(root, eye)
    covariance = _sym(root_inverse.T @ root_inverse)
    mean = _upper_solve(root.T, _lower_solve(root, vector))
    return mean, jnp.linalg.cholesky(covariance)


def _diag_gradient(m: Array, s: Array, g_m: Array, g_s: Array) -> tuple:
    variance = s * s
    g_var = g_s / (2.0 * s)
    return (m / variance, -0.5 / variance), (g_m - 2.0 * m * g_var, g_var)


def _diag_admissible(theta: tuple, grad: tuple, rate: Array) -> Array:
    precision = -2.0 * (theta[1] - rate * grad[1])
    mean = (theta[0] - rate * grad[0]) / precision
    return jnp.all(precision > 0) & jnp.all(jnp.isfinite(mean))


def _diag_moments(theta: tuple, grad: tuple, rate: Array) -> tuple[Array, Array]:
    precision = -2.0 * (theta[1] - rate * grad[1])
    return (theta[0] - rate * grad[0]) / precision, jnp.sqrt(1.0 / precision)


def _step(
    site: _Site, leaves: list, grads: list, rates: Array
) -> tuple[Array, Array, Array]:
    """The new raw location and scale of `site` and whether any of `rates` (the
    step sizes to try, largest first) kept it in the positive-definite cone."""
    m = _value(site.loc, leaves[site.loc.leaf])
    scale = _value(site.scale, leaves[site.scale.leaf])
    g_m = _pull_back(site.loc, m, grads[site.loc.leaf])
    g_scale = _pull_back(site.scale, scale, grads[site.scale.leaf])
    if site.kind == "tri":
        if m.ndim == 0 or scale.shape != (*m.shape, m.shape[-1]):
            raise ValueError(
                f"natural_gradient: the Gaussian `{site.label}` has a location of "
                f"shape {m.shape} and a Cholesky factor of shape {scale.shape}; "
                "give the factor the location's shape plus one axis (batch shapes "
                "equal, no broadcasting)."
            )
        batch, d = m.shape[:-1], m.shape[-1]
        n = math.prod(batch)
        flat = [m.reshape(n, d), scale.reshape(n, d, d)]
        gflat = [g_m.reshape(n, d), g_scale.reshape(n, d, d)]
        theta, grad = jax.vmap(_tri_gradient)(*flat, *gflat)
        admissible = jax.vmap(_tri_admissible, in_axes=(0, 0, None))
        ok = jax.vmap(lambda r: jnp.all(admissible(theta, grad, r)))(rates)
        first = jnp.argmax(ok)
        new_m, new_l = jax.vmap(_tri_moments, in_axes=(0, 0, None))(
            theta, grad, rates[first]
        )
        new_m, new_scale = new_m.reshape(m.shape), new_l.reshape(scale.shape)
    else:
        if scale.shape != m.shape:
            raise ValueError(
                f"natural_gradient: the Gaussian `{site.label}` has a location of "
                f"shape {m.shape} and a scale of shape {scale.shape}; give them one "
                "shape (one standard deviation per location, no broadcasting)."
            )
        theta, grad = _diag_gradient(m, scale, g_m, g_scale)
        ok = jax.vmap(lambda r: _diag_admissible(theta, grad, r))(rates)
        first = jnp.argmax(ok)
        new_m, new_scale = _diag_moments(theta, grad, rates[first])
    return _raw(site.loc, new_m), _raw(site.scale, new_scale), ok[first]


# --------------------------------------------------------------- the transformation


def _rate_of(learning_rate: Any) -> Callable[[Array], Any]:
    why = (
        "It must lie in (0, 1]: each step is then a convex combination of the "
        "current natural parameters and their target, which keeps the precision "
        "positive definite for log-concave likelihoods; 1 is the exact optimum in "
        "one step for a Gaussian likelihood on the full batch, ~0.1 is the usual "
        "choice with minibatches. Pass an optax schedule for steps that vary."
    )
    if callable(learning_rate):
        return learning_rate
    try:
        rate = jnp.asarray(learning_rate)
    except TypeError:
        rate = None
    if rate is None or isinstance(learning_rate, bool) or rate.dtype == bool:
        raise TypeError(
            f"natural_gradient: `learning_rate` must be a number or an optax "
            f"schedule, got {learning_rate!r}. {why}"
        )
    if rate.ndim != 0 or not jnp.issubdtype(rate.dtype, jnp.number):
        raise TypeError(
            f"natural_gradient: `learning_rate` must be a real scalar, got "
            f"{learning_rate!r}."
        )
    if not is_traced(rate) and not (0 < float(rate) <= 1):
        raise ValueError(f"natural_gradient: `learning_rate` is {float(rate)}. {why}")
    return lambda _: learning_rate


def _fraction(name: str, value: Any) -> Any:
    """`value` checked to be a real scalar in (0, 1) where it is concrete (a
    traced one, from `optax.inject_hyperparams`, as it is)."""
    try:
        x = jnp.asarray(value)
    except TypeError:
        x = None
    if (
        x is not None
        and x.ndim == 0
        and not isinstance(value, bool)
        and jnp.issubdtype(x.dtype, jnp.floating) | jnp.issubdtype(x.dtype, jnp.integer)
        and (is_traced(x) or 0 < float(x) < 1)
    ):
        return value
    raise ValueError(f"natural_gradient: `{name}` must be in (0, 1), got {value!r}.")


def natural_gradient(
    learning_rate: ArrayLike | Callable[[Array], Any],
    optimiser: optax.GradientTransformation | None = None,
    *,
    where: Callable[[Any], Any] | None = None,
    backoff: ArrayLike = 0.5,
    max_backoff: SupportsIndex = 5,
) -> optax.GradientTransformationExtraArgs:
    """Natural-gradient steps for the Gaussians of a model, `optimiser` for the rest.

    **Arguments:**

    - `learning_rate`: the natural-gradient step size `γ` in `(0, 1]`, or an optax
      schedule of the step count (values in `[0, 1]`, 0 a step that changes
      nothing). `1.0` reaches the optimal `q` in one step when the likelihood is
      Gaussian, the batch full and the loss's expectations exact; ~`0.1` is the
      usual choice with minibatches or other likelihoods, and smaller still with
      a Monte Carlo ELBO of few samples, whose noisy `∂ℓ/∂S` can push a large
      step out of the positive-definite cone.
    - `optimiser`: any optax transformation for the other trainable leaves
      (kernel hyperparameters, inducing inputs, point estimates), or `None` to
      leave them unchanged (zero updates).
    - `where`: a where-function selecting the Gaussians to update, as for
      `eqx.tree_at` (`lambda m: m.q_v`, or a tuple of them). `None` takes the
      model's one trained Gaussian (outside other wrappers) and refuses a model
      with none or several: a likelihood's or a prior's Gaussian is no
      variational distribution, so say which are.
    - `backoff`, `max_backoff`: a step whose precision is not positive definite
      is retried with `γ·backoff^k`, `k = 1 .. max_backoff` (all tried at once;
      the first admissible one is taken), as GPJax's `fit_natgrads` does.
      `max_backoff` is static (with `optax.inject_hyperparams`, name it in
      `static_args`).

    **Returns:**

    An `optax.GradientTransformationExtraArgs` for `ep.fit(..., optimiser=...)`.
    Its `update` takes `updates` as the gradient of the loss and needs `params`
    and, with an `optimiser`, `value_fn=` (the loss of the parameters at this
    step's batch and key): `ep.fit` passes both. With an `optimiser` it takes the
    rest's gradient again at the updated Gaussians, so it must get the loss's
    gradient itself: it refuses to follow other transformations in an
    `optax.chain` or to sit inside `optax.MultiSteps` (put those in `optimiser`).
    With `optimiser=None` it steps on the `updates` it is given, needs no
    `value_fn` and composes with `optax.multi_transform` (the other group then
    steps at the current Gaussians, not the updated ones).

    **Raises:**

    At `init`/`update` (`ep.fit`'s start), a `ValueError`/`TypeError` naming the
    leaf for: a `where` that selects something that is not such a Gaussian, a
    `'low_rank'` guide (its family is not closed under the step: use
    `'full_rank'`), a Gaussian whose location or scale is frozen, broadcast or
    not an array, `where=None` with no or several trained Gaussians, an
    `optimiser` after other transformations. Here: a `learning_rate` outside
    `(0, 1]`. While training, if no step size tried keeps a Gaussian's
    precision positive definite (or a schedule leaves `[0, 1]`), its new
    location and scale are NaN, as GPJax's, and `ep.fit` stops with an
    `ep.NonFiniteLossError` naming them (the rest took its step at the old
    Gaussian), `error.model` the model before that step; under a JAX
    transformation (`jax.jit` around `ep.fit`) the NaN stays in the model.

    **Example:**

    ```python
    import distrax
    import jax.numpy as jnp
    import eqxprob as ep

    # y ~ N(θ, 1), θ ~ N(0, 1): the posterior is N(Σy / (n + 1), 1 / (n + 1)).
    y = jnp.array([0.5, 1.5, 1.0])
    q = ep.FixedDistrax(distrax.Normal, jnp.array(0.0), ep.positive(2.0))

    def negative_elbo(q):
        q = ep.resolve(q)
        m, s = q.loc, q.scale
        expected_loglik = -0.5 * jnp.sum((y - m) ** 2 + s**2)
        return -(expected_loglik - q.kl_divergence(distrax.Normal(0.0, 1.0)))

    q, _ = ep.fit(q, negative_elbo, optimiser=ep.natural_gradient(1.0), steps=1,
                  progress=False)
    q = ep.resolve(q)
    assert jnp.allclose(q.loc, 0.75) and jnp.allclose(q.scale, 0.5)
    ```

    **Which Gaussians.** Wrapped `MultivariateNormalTri`, `MultivariateNormalDiag`
    and `Normal` of distrax (TFP's `MultivariateNormalTriL`,
    `MultivariateNormalDiag`, `Normal`; numpyro's `MultivariateNormal` with
    `scale_tril=` and `Normal`), exactly those classes, with their location and
    scale trained as plain arrays or `ep.Bijector`s (`ep.lower_cholesky`,
    `ep.positive`); and `ep.guide`'s `'mean_field'` and `'full_rank'` guides. A
    batch of Gaussians steps with one step size (backed off until all of them
    stay positive definite).

    **Each step** (GPJax's order): the natural-gradient step on the Gaussians at
    the gradient `ep.fit` took, then one step of `optimiser` on the rest with the
    gradient at the updated Gaussians (one more gradient of the loss; none with
    `optimiser=None`). The step is `θ ← θ - γ ∂ℓ/∂η` on the natural parameters
    `θ = (S⁻¹m, -½S⁻¹)` with the gradient w.r.t. the expectation parameters
    `η = (m, S + mmᵀ)`, written back to each leaf through its transform's
    inverse; with the same start, learning rates and batches its iterates are
    GPJax 1.0's `fit_natgrads` iterates.
    """
    rate_of = _rate_of(learning_rate)
    if optimiser is not None and not isinstance(
        optimiser, optax.GradientTransformation
    ):
        raise TypeError(
            "natural_gradient: `optimiser` must be an optax GradientTransformation "
            f"(e.g. `optax.adam(1e-2)`) or None, got {type(optimiser).__name__}."
        )
    if where is not None:
        where_labels(where)  # (a where that does more than select: raises now)
    backoff = _fraction("backoff", backoff)
    try:  # (the number of step sizes tried: static)
        max_backoff = operator.index(max_backoff)
    except TypeError:
        max_backoff = -1
    if isinstance(max_backoff, bool) or not 0 <= max_backoff <= 64:
        raise ValueError(
            "natural_gradient: `max_backoff` must be an int in 0 .. 64 (with "
            "`optax.inject_hyperparams`, pass `static_args=('max_backoff',)`), "
            f"got {max_backoff!r}."
        )

    def rest_of(tree: PyTree, treedef: Any, sites: list[_Site]) -> PyTree:
        leaves = treedef.flatten_up_to(tree)
        for site in sites:
            leaves[site.loc.leaf] = leaves[site.scale.leaf] = None
        return jtu.tree_unflatten(treedef, leaves)

    def init(params: PyTree) -> NaturalGradientState:
        sites = _sites(params, where)
        inner = optax.EmptyState()
        if optimiser is not None:
            inner = optimiser.init(rest_of(params, jtu.tree_structure(params), sites))
        return NaturalGradientState(jnp.zeros((), jnp.int32), inner)

    def update(
        updates: PyTree,
        state: Any,
        params: PyTree | None = None,
        *,
        value_fn: Callable[[PyTree], Array] | None = None,
        grad: PyTree | None = None,
        **extra: Any,
    ) -> tuple[PyTree, NaturalGradientState]:
        del extra
        if params is None:
            raise TypeError(
                "natural_gradient: `update` needs `params` (and `value_fn=`, the "
                "loss of the parameters, with an `optimiser`): `ep.fit` passes both; "
                "in a loop of your own, `opt.update(grads, state, params, "
                "value_fn=loss)`."
            )
        sites = _sites(params, where)
        leaves, treedef = jtu.tree_flatten(params)
        grads = treedef.flatten_up_to(updates)
        count = state.step
        rate = jnp.asarray(rate_of(count.astype(jnp.result_type(int))))
        if rate.ndim != 0:
            raise TypeError(
                "natural_gradient: the `learning_rate` schedule must return a "
                f"scalar, got shape {rate.shape}."
            )
        # `new`: the parameters after the step; `moved`: the same where the step
        # is fine, else as before (where the rest's gradient is taken).
        new, moved = list(leaves), list(leaves)
        for site in sites:
            dtype = leaves[site.loc.leaf].dtype
            exponents = jnp.arange(max_backoff + 1, dtype=dtype)
            rates = rate.astype(dtype) * jnp.asarray(backoff, dtype) ** exponents
            new_loc, new_scale, fine = _step(site, leaves, grads, rates)
            # No step size kept the precision positive definite, or a schedule
            # left (0, 1]: NaN, as GPJax (`ep.fit` then stops, naming the leaves).
            fine = fine & (rate >= 0) & (rate <= 1)
            for slot, value in ((site.loc, new_loc), (site.scale, new_scale)):
                old = leaves[slot.leaf]
                new[slot.leaf] = jnp.where(fine, value, jnp.nan).astype(old.dtype)
                moved[slot.leaf] = jnp.where(fine, value, old).astype(old.dtype)
        changed = [i for s in sites for i in (s.loc.leaf, s.scale.leaf)]
        out = [
            new[i] - x if i in changed else jnp.zeros_like(x)
            for i, x in enumerate(leaves)
        ]
        inner = state.inner
        if optimiser is not None and len(set(changed)) < len(leaves):
            # The rest's gradient is taken again, at the updated Gaussians: right
            # only where `updates` is this step's gradient itself.
            given = jtu.tree_leaves(grad)
            if given and any(u is not g for u, g in zip(grads, given)):
                raise TypeError(
                    "natural_gradient: with an `optimiser`, it takes the other "
                    "parameters' gradient again at the updated Gaussians, so it must "
                    "get the loss's gradient itself: not after other transformations "
                    "in an `optax.chain`, nor inside `optax.MultiSteps`. Put those "
                    "in `optimiser` (`natural_gradient(lr, optax.chain(clip, adam))`), "
                    "or use `natural_gradient(lr)` (no optimiser: it then steps on "
                    "the `updates` it is given) in an `optax.multi_transform`."
                )
            if value_fn is None:
                raise TypeError(
                    "natural_gradient: with an `optimiser`, `update` needs "
                    "`value_fn=` (the loss of the parameters), for the gradient at "
                    "the updated Gaussians: `ep.fit` passes it; in a loop of your "
                    "own, `opt.update(grads, state, params, value_fn=loss)`."
                )
            rest = rest_of(jtu.tree_unflatten(treedef, moved), treedef, sites)

            def loss_of_rest(rest: PyTree) -> Array:
                # (the Gaussians held fixed: only the rest's gradient is taken,
                # and the first gradient's part for the rest, unused, is
                # dropped by XLA, so the two cost what GPJax's two do)
                values = treedef.flatten_up_to(rest)
                values = [moved[i] if i in changed else v for i, v in enumerate(values)]
                return value_fn(jtu.tree_unflatten(treedef, values))

            value, gradient = jax.value_and_grad(loss_of_rest)(rest)
            rest_updates, inner = optax.with_extra_args_support(optimiser).update(
                gradient, inner, rest, value=value, grad=gradient, value_fn=loss_of_rest
            )
            for i, x in enumerate(treedef.flatten_up_to(rest_updates)):
                if i not in changed:
                    out[i] = x
        state = NaturalGradientState(count + 1, inner)
        return jtu.tree_unflatten(treedef, out), state

    return optax.GradientTransformationExtraArgs(init, update)
