"""Parameter metadata: constraints, bijectors, priors and trainability per leaf.

`ep.field(constraint=..., prior=...)` stores a `ParamSpec` in a dataclass field's
metadata; `WhereDict` overrides attach specs to modules you do not own. The tree
builders walk the model once, read the metadata along each leaf's key path, and
return trees with the model's exact structure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, PyTree

from . import _bijector as _bij
from ._where import WhereDict, where_labels, where_paths
from ._wrappers import FixedDistrax


_METADATA_KEY = "eqxprob"


# --- constraints ---------------------------------------------------------------


class Constraint:
    """Base class of constraints: the support a parameter must lie in.

    Subclass it, implement `check`, and register a default bijector for it with
    `ep.register_bijector`.
    """

    def check(self, value: Array) -> Array:
        """Elementwise (or per-matrix) boolean: is `value` in the support?"""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"constraints.{type(self).__name__.lstrip('_').lower()}"


class Real(Constraint):
    """Any finite real number."""

    def check(self, value: Array) -> Array:
        return jnp.isfinite(value)

    def __repr__(self) -> str:
        return "constraints.real"


class Positive(Constraint):
    """Strictly positive, finite values."""

    def check(self, value: Array) -> Array:
        return (value > 0) & jnp.isfinite(value)

    def __repr__(self) -> str:
        return "constraints.positive"


@dataclasses.dataclass(frozen=True, repr=False)
class Interval(Constraint):
    """The open interval `(low, high)`."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not np.all(np.asarray(self.low) < np.asarray(self.high)):
            raise ValueError(
                f"constraints.interval({self.low}, {self.high}): `low` must be "
                "smaller than `high`."
            )

    def check(self, value: Array) -> Array:
        return (value > self.low) & (value < self.high)

    def __repr__(self) -> str:
        return f"constraints.interval({self.low}, {self.high})"


class LowerCholesky(Constraint):
    """Lower-triangular square matrices with a positive diagonal."""

    def check(self, value: Array) -> Array:
        value = jnp.asarray(value)
        if value.ndim < 2 or value.shape[-1] != value.shape[-2]:
            return jnp.zeros((), bool)
        upper = jnp.triu(value, 1)
        diagonal = jnp.diagonal(value, axis1=-2, axis2=-1)
        return (
            jnp.all(upper == 0, axis=(-2, -1))
            & jnp.all(diagonal > 0, axis=-1)
            & jnp.all(jnp.isfinite(value), axis=(-2, -1))
        )

    def __repr__(self) -> str:
        return "constraints.lower_cholesky"


class Simplex(Constraint):
    """Vectors of positive entries that sum to one along the last axis (the open
    simplex, the range of `ep.simplex`)."""

    def check(self, value: Array) -> Array:
        value = jnp.asarray(value)
        if value.ndim < 1:
            return jnp.zeros((), bool)
        tolerance = 1e-6 if value.dtype == jnp.float64 else 1e-5
        total = jnp.sum(value, axis=-1)
        return jnp.all(value > 0, axis=-1) & (jnp.abs(total - 1) < tolerance)

    def __repr__(self) -> str:
        return "constraints.simplex"


class _Constraints:
    """The namespace `ep.constraints`: supports a parameter may be constrained to.

    Instances `real`, `positive`, `unit_interval`, `lower_cholesky`, `simplex`;
    `interval(low, high)` builds an open interval; the classes (`Constraint`,
    `Positive`, ...) are there to subclass and to register bijectors for.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    assert bool(ep.constraints.positive.check(jnp.array(2.0)))
    assert not bool(ep.constraints.interval(0.0, 1.0).check(jnp.array(1.5)))
    ```
    """

    Constraint = Constraint
    Real = Real
    Positive = Positive
    Interval = Interval
    LowerCholesky = LowerCholesky
    Simplex = Simplex

    real = Real()
    positive = Positive()
    unit_interval = Interval(0.0, 1.0)
    lower_cholesky = LowerCholesky()
    simplex = Simplex()

    @staticmethod
    def interval(low: float, high: float) -> Interval:
        """The open interval `(low, high)`."""
        return Interval(low, high)

    def __repr__(self) -> str:
        return "eqxprob.constraints"


constraints = _Constraints()
"""Supports a parameter may be constrained to: `real`, `positive`, `unit_interval`,
`interval(low, high)`, `lower_cholesky`, `simplex`, and the classes to subclass
(`Constraint`) or register bijectors for. See `_Constraints` for an example."""


# --- constraint -> default bijector ------------------------------------------------

_BIJECTOR_FACTORIES: dict[type, Callable[[Any], Any]] = {}


def register_bijector(constraint_type: type) -> Callable[[Callable], Callable]:
    """Register the default bijector of a constraint type (like numpyro's `biject_to`).

    The decorated factory takes the constraint instance and returns a bijector:
    a `FixedDistrax` bijector, or any module with `forward`, `inverse` and
    `forward_log_det_jacobian`. Lookup is by `type(constraint)`.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep
    from tensorflow_probability.substrates import jax as tfp

    class Negative(ep.constraints.Constraint):
        def check(self, value):
            return value < 0

    @ep.register_bijector(Negative)
    def _(constraint):
        return ep.FixedDistrax(tfp.bijectors.Chain, [
            ep.FixedDistrax(tfp.bijectors.Scale, jnp.array(-1.0)),
            ep.FixedDistrax(tfp.bijectors.Exp),
        ])

    bijector = ep.default_bijector(Negative())
    print(bijector.forward(jnp.array(0.0)))  # -1.0
    ```
    """
    if not (
        isinstance(constraint_type, type) and issubclass(constraint_type, Constraint)
    ):
        raise TypeError(
            "register_bijector takes a subclass of `ep.constraints.Constraint`, got "
            f"{constraint_type!r}."
        )

    def decorator(factory: Callable) -> Callable:
        _BIJECTOR_FACTORIES[constraint_type] = factory
        return factory

    return decorator


def default_bijector(constraint: Constraint) -> Any:
    """The default bijector from unconstrained space onto `constraint`'s support.

    **Raises:**

    `TypeError` naming the constraint if no bijector is registered for its type.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    softplus = ep.default_bijector(ep.constraints.positive)
    print(softplus.forward(jnp.array(0.0)))  # log(2) = 0.6931...
    ```
    """
    factory = _BIJECTOR_FACTORIES.get(type(constraint))
    if factory is None:
        raise TypeError(
            f"No default bijector is registered for the constraint {constraint!r} "
            f"(type {type(constraint).__name__}). Register one with "
            f"`@ep.register_bijector({type(constraint).__name__})`, or pass "
            "`bijector=` explicitly."
        )
    return factory(constraint)


_IDENTITY = FixedDistrax(_bij.tfb.Identity)

register_bijector(Real)(lambda c: _IDENTITY)
register_bijector(Positive)(lambda c: _bij._Softplus())
register_bijector(Interval)(
    lambda c: _bij._Interval(_bij._as_float(c.low), _bij._as_float(c.high))
)
register_bijector(LowerCholesky)(lambda c: _bij._LowerCholesky())
register_bijector(Simplex)(lambda c: _bij._SoftmaxCentered())


# --- metadata -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """What eqxprob knows about one parameter.

    **Arguments:**

    - `bijector`: maps unconstrained space onto the parameter's support; a
      `FixedDistrax` bijector, a raw TFP bijector, a raw distrax bijector without
      arrays (e.g. `distrax.Sigmoid()`), or a callable, as for `ep.Bijector`.
      Defaults to `ep.default_bijector(constraint)`, or the identity without a
      constraint.
    - `constraint`: an `ep.constraints` member: the support, checked on
      `unconstrain`/`parameterize`.
    - `prior`: a distribution (`FixedDistrax` or raw distrax/TFP) over the
      *constrained* value, used by `ep.log_prior`.
    - `trainable`: `False` freezes the parameter (`ep.parameterize` wraps it in
      `ep.Frozen`, so `ep.trainable` excludes it).

    **Example:**

    ```python
    import distrax
    import jax.numpy as jnp
    import eqxprob as ep

    spec = ep.ParamSpec(
        constraint=ep.constraints.positive,
        prior=ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0)),
    )
    ```
    """

    bijector: Any = None
    constraint: Constraint | None = None
    prior: Any = None
    trainable: bool = True

    def __post_init__(self) -> None:
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise TypeError(
                f"ParamSpec: `constraint` must be an `ep.constraints` member, got "
                f"{self.constraint!r}."
            )
        if not isinstance(self.trainable, bool):
            raise TypeError(
                f"ParamSpec: `trainable` must be True or False, got {self.trainable!r}."
            )

    def resolved_bijector(self) -> Any:
        """`bijector`, else the constraint's default bijector, else the identity."""
        if self.bijector is not None:
            return _bij._as_transform(self.bijector)
        if self.constraint is not None:
            return default_bijector(self.constraint)
        return _IDENTITY

    @property
    def annotated(self) -> bool:
        """Whether the spec changes the parameterisation (bijector or constraint)."""
        return self.bijector is not None or self.constraint is not None


def field(
    *,
    bijector: Any = None,
    constraint: Constraint | None = None,
    prior: Any = None,
    trainable: bool = True,
    **kwargs: Any,
) -> Any:
    """An `eqx.field` carrying a `ParamSpec` for the parameter it declares.

    **Arguments:**

    - `bijector`, `constraint`, `prior`, `trainable`: as for `ep.ParamSpec`.
    - `**kwargs`: passed to `eqx.field` (e.g. `converter=`, `default=`).

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class RBF(eqx.Module):
        lengthscale: jnp.ndarray = ep.field(constraint=ep.constraints.positive)
        variance: jnp.ndarray = ep.field(
            constraint=ep.constraints.positive,
            prior=ep.FixedDistrax(distrax.Normal, jnp.array(1.0), jnp.array(1.0)),
        )

    kernel = RBF(jnp.array(1.0), jnp.array(2.0))
    raw = ep.unconstrain(kernel)   # inverse softplus of each parameter
    assert jnp.allclose(ep.constrain(raw).variance, 2.0)
    ```
    """
    spec = ParamSpec(
        bijector=bijector, constraint=constraint, prior=prior, trainable=trainable
    )
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata[_METADATA_KEY] = spec
    return eqx.field(metadata=metadata, **kwargs)


# --- traversal ------------------------------------------------------------------


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, ParamSpec)


def _label(path: tuple) -> str:
    return jtu.keystr(path).lstrip(".")


def _field_spec(node: Any, name: str) -> ParamSpec | None:
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            if f.name == name:
                return f.metadata.get(_METADATA_KEY)
    return None


def _child(node: Any, key: Any) -> Any:
    if isinstance(key, jtu.GetAttrKey):
        return getattr(node, key.name)
    if isinstance(key, (jtu.SequenceKey, jtu.DictKey)):
        return node[key.idx if isinstance(key, jtu.SequenceKey) else key.key]
    return None  # a custom node: metadata below it is not read


def _metadata_spec(model: Any, path: tuple) -> ParamSpec | None:
    """The innermost field metadata along `path` (a field annotates its subtree)."""
    spec, node = None, model
    for key in path:
        if node is None:
            break
        if isinstance(key, jtu.GetAttrKey):
            spec = _field_spec(node, key.name) or spec
        node = _child(node, key)
    return spec


def _override_specs(model: Any, overrides: Any) -> list[tuple[tuple, ParamSpec]]:
    if overrides is None:
        return []
    if not isinstance(overrides, WhereDict):
        overrides = WhereDict(overrides)
    found = []
    for where, spec in overrides.where_items():
        if not isinstance(spec, ParamSpec):
            raise TypeError(
                f"overrides[{where_labels(where)!r}] must be an `ep.ParamSpec`, "
                f"got {type(spec).__name__}."
            )
        found.append((tuple(where_paths(where, model)), spec))
    # Deeper overrides are more specific: apply them last.
    return sorted(found, key=lambda item: len(item[0]))


def _leaf_specs(model: Any, overrides: Any) -> tuple[list, Any]:
    """`(path, spec, leaf)` for every leaf of `model` (one flatten), and the treedef."""
    leaves_with_paths, treedef = jtu.tree_flatten_with_path(model)
    specs = [_metadata_spec(model, path) for path, _ in leaves_with_paths]
    for prefix, spec in _override_specs(model, overrides):
        n = len(prefix)
        for i, (path, _) in enumerate(leaves_with_paths):
            if tuple(path[:n]) == prefix:
                specs[i] = spec
    entries = [
        (path, spec, leaf) for (path, leaf), spec in zip(leaves_with_paths, specs)
    ]
    return entries, treedef


def _map_leaves(model: Any, overrides: Any, fn: Callable) -> PyTree:
    """`fn(path, spec, leaf)` at every leaf, rebuilt with `model`'s structure."""
    entries, treedef = _leaf_specs(model, overrides)
    return jtu.tree_unflatten(treedef, [fn(*entry) for entry in entries])


def spec_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the `ParamSpec` (or `None`) of each leaf.

    Specs come from `ep.field` metadata (a field annotates every leaf below it;
    the innermost annotation wins) and from `overrides`, a `WhereDict` (or dict)
    from where-functions or labels to `ParamSpec`s, which win over metadata.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module`.
    - `overrides`: optional `{where: ParamSpec}`; a where that selects nothing in
      `model` raises `ValueError` naming its label.

    **Returns:**

    A PyTree with `model`'s structure; map over it with
    `is_leaf=lambda x: x is None or isinstance(x, ep.ParamSpec)`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    linear = eqx.nn.Linear(2, 1, key=jax.random.PRNGKey(0))
    specs = ep.spec_tree(linear, {lambda l: l.bias: ep.ParamSpec(trainable=False)})
    assert specs.weight is None and specs.bias.trainable is False
    ```
    """
    return _map_leaves(model, overrides, lambda path, spec, leaf: spec)


def bijector_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the bijector of each leaf.

    Unannotated leaves get the identity bijector. See `ep.spec_tree` for how specs
    are found.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), winning over field metadata.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Noise(eqx.Module):
        scale: jnp.ndarray = ep.field(constraint=ep.constraints.positive)

    bijectors = ep.bijector_tree(Noise(jnp.array(0.5)))
    print(bijectors.scale.forward(jnp.array(0.0)))  # softplus(0) = log 2
    ```
    """
    return _map_leaves(
        model,
        overrides,
        lambda path, spec, leaf: (
            _IDENTITY if spec is None else spec.resolved_bijector()
        ),
    )


def prior_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the prior of each leaf (`None` if none).

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), winning over field metadata.

    **Example:**

    ```python
    import distrax
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Noise(eqx.Module):
        scale: jnp.ndarray = ep.field(
            prior=ep.FixedDistrax(distrax.Normal, jnp.array(0.0), jnp.array(1.0))
        )
        shift: jnp.ndarray

    priors = ep.prior_tree(Noise(jnp.array(0.5), jnp.array(0.0)))
    assert priors.shift is None
    ```
    """
    return _map_leaves(
        model, overrides, lambda path, spec, leaf: None if spec is None else spec.prior
    )


def _check_support(label: str, spec: ParamSpec, value: Any) -> None:
    if spec.constraint is None or not eqx.is_array(value):
        return
    if isinstance(value, jax.core.Tracer):
        return  # traced (e.g. under `jit`): cannot check eagerly
    ok = np.asarray(spec.constraint.check(jnp.asarray(value)))
    if not ok.all():
        raise ValueError(
            f"Parameter `{label}` = {_bij._short(value)} is outside the support of "
            f"{spec.constraint!r}. Initialise it inside the support (or change its "
            "constraint)."
        )


def _map_annotated(model: PyTree, overrides: Any, fn: Callable) -> PyTree:
    """Apply `fn` at annotated float leaves. Results get a strong dtype, so a
    jitted step fed weakly typed values (`jnp.array(1.0)`) does not compile twice."""

    def apply(path: tuple, spec: ParamSpec | None, leaf: Any) -> Any:
        if spec is not None and spec.annotated and eqx.is_inexact_array(leaf):
            return _bij._as_float(fn(_label(path), spec, leaf))
        return leaf

    return _map_leaves(model, overrides, apply)


def unconstrain(model: PyTree, overrides: Any = None) -> PyTree:
    """Map every annotated parameter to unconstrained space (the bijector's inverse).

    A value outside its constraint's support raises `ValueError` naming its path,
    e.g. `kernels[0].lengthscale`. `ep.constrain` is the exact inverse.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), winning over field metadata.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Noise(eqx.Module):
        scale: jnp.ndarray = ep.field(constraint=ep.constraints.positive)

    raw = ep.unconstrain(Noise(jnp.array(2.0)))
    assert jnp.allclose(ep.constrain(raw).scale, 2.0)
    ```
    """

    def inverse(label: str, spec: ParamSpec, value: Array) -> Array:
        _check_support(label, spec, value)
        return spec.resolved_bijector().inverse(value)

    return _map_annotated(model, overrides, inverse)


def constrain(raw_model: PyTree, overrides: Any = None) -> PyTree:
    """Map every annotated parameter from unconstrained space (the bijector's forward).

    Call it at the top of a loss on a model produced by `ep.unconstrain`, so that
    gradients live in unconstrained space.

    **Arguments:**

    - `raw_model`: a model as returned by `ep.unconstrain`.
    - `overrides`: the same overrides given to `ep.unconstrain`.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Noise(eqx.Module):
        scale: jnp.ndarray = ep.field(constraint=ep.constraints.positive)

    raw = ep.unconstrain(Noise(jnp.array(2.0)))
    grad = eqx.filter_grad(lambda r: ep.constrain(r).scale)(raw)
    # d softplus(u) / du = sigmoid(u) = 1 - exp(-2)
    assert jnp.allclose(grad.scale, 1 - jnp.exp(-2.0))
    ```
    """
    return _map_annotated(
        raw_model, overrides, lambda label, spec, u: spec.resolved_bijector().forward(u)
    )


def parameterize(model: PyTree, overrides: Any = None) -> PyTree:
    """Turn annotated parameters into `ep.Bijector` nodes, frozen ones into `ep.Frozen`.

    `ep.resolve(ep.parameterize(m))` equals `m`; `ep.trainable` then selects exactly
    the unconstrained parameters that should train.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), winning over field metadata.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Kernel(eqx.Module):
        lengthscale: jnp.ndarray = ep.field(constraint=ep.constraints.positive)
        period: jnp.ndarray = ep.field(trainable=False)

    model = ep.parameterize(Kernel(jnp.array(1.5), jnp.array(3.0)))
    assert ep.is_bijector(model.lengthscale)
    assert jnp.allclose(ep.resolve(model).lengthscale, 1.5)
    ```
    """

    def to_node(path: tuple, spec: ParamSpec | None, leaf: Any) -> Any:
        if spec is not None and eqx.is_inexact_array(leaf):
            if spec.annotated:
                _check_support(_label(path), spec, leaf)
                leaf = _bij.Bijector.from_value(leaf, spec.resolved_bijector())
            if not spec.trainable:
                leaf = _bij.frozen(leaf)
        return leaf

    return _map_leaves(model, overrides, to_node)


def log_prior(model: PyTree, overrides: Any = None) -> Array:
    """Sum of the prior log-densities of the (constrained) parameters.

    This is a density over the *constrained* values. For a density over the
    unconstrained parameters that an optimiser or sampler actually moves, add the
    log-determinant of the Jacobian of the transform:

    ```python
    import distrax
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    class Kernel(eqx.Module):
        lengthscale: jnp.ndarray = ep.field(
            constraint=ep.constraints.positive,
            prior=ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0)),
        )

    params = ep.parameterize(Kernel(jnp.array(1.5)))
    constrained = ep.log_prior(ep.resolve(params))       # log p(lengthscale)
    unconstrained = constrained + ep.log_det_jacobian(params)  # log p(u)
    ```

    **Arguments:**

    - `model`: a model holding constrained values (resolve a parameterized one
      first); leaves without a prior contribute nothing.
    - `overrides`: optional `{where: ParamSpec}`, as for `ep.spec_tree`.

    **Returns:**

    A scalar.
    """
    entries, _ = _leaf_specs(model, overrides)
    total = jnp.zeros(())
    for path, spec, leaf in entries:
        if spec is None or spec.prior is None:
            continue
        if not hasattr(spec.prior, "log_prob"):
            raise TypeError(
                f"The prior of `{_label(path)}` is {spec.prior!r}, which has no "
                "`log_prob`. Use a distribution: `ep.FixedDistrax(distrax.Normal, "
                "...)` or a raw distrax/TFP distribution."
            )
        total = total + jnp.sum(spec.prior.log_prob(leaf))
    return total
