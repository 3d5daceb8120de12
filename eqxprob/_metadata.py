"""Parameter metadata: constraints, bijectors, priors and trainability per leaf.

`ep.field(constraint=..., prior=...)` stores a `ParamSpec` in a dataclass field's
metadata; `WhereDict` overrides attach specs to modules you do not own, merged
attribute by attribute over the field's own. The tree builders walk the model once,
read the spec along each leaf's key path, and return trees with the model's exact
structure.

Metadata stops at parameter nodes: a field holding an `ep.Bijector` or `ep.Frozen`
node is already parameterised, so its spec describes the node's *value* (checked
against the constraint, scored by the prior after `ep.resolve`), never the
unconstrained `param` or the bounds inside it.

Every transform goes through `_transforms` and every check through
`_constraint.validate` and `_parameter.to_unconstrained`, as for the shortcuts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeGuard

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, Float, PyTree

from . import _constraint, _errors, _parameter, _support, _transforms
from ._constraint import Constraint
from ._families import as_tuple
from ._where import WhereDict, step, where_labels, where_paths
from ._wrappers import FixedDistrax


_METADATA_KEY = "eqxprob"


@dataclasses.dataclass(frozen=True, eq=False)
class ParamSpec:
    """What eqxprob knows about one parameter.

    **Arguments:**

    - `bijector`: maps unconstrained space onto the parameter's support; a
      `FixedDistrax` bijector, a raw TFP bijector, a raw distrax bijector without
      arrays (e.g. `distrax.Sigmoid()`), or a callable (forward only: fine for
      `constrain`, an error for `unconstrain`). Defaults to
      `ep.default_bijector(constraint)`, or the identity without a constraint.
      Given together with `constraint`, its range must lie in the constraint
      (checked).
    - `constraint`: an `ep.constraints` member (or a numpyro constraint): the
      support, checked on `unconstrain`/`parameterize`.
    - `prior`: a distribution (`FixedDistrax`, raw distrax/TFP/numpyro) over the
      *constrained* value, used by `ep.log_prior`.
    - `trainable`: `False` freezes the parameter (`ep.parameterize` wraps it in
      `ep.Frozen`, so `ep.trainable` excludes it). `None` (the default) means "not
      set": trainable, unless an outer spec says otherwise.

    An attribute left as `None` is "not set": when an override meets a field's
    own spec, `merged` takes each attribute from the override where it is set and
    from the field elsewhere.

    **Example:**

    ```python
    import distrax
    import jax.numpy as jnp
    import eqxprob as ep

    spec = ep.ParamSpec(
        constraint=ep.constraints.positive,
        prior=ep.FixedDistrax(distrax.Gamma, jnp.array(2.0), jnp.array(1.0)),
    )
    only_prior = ep.ParamSpec(prior=spec.prior)
    assert only_prior.merged(spec).constraint is ep.constraints.positive
    ```
    """

    bijector: Any = None
    constraint: Constraint | None = None
    prior: Any = None
    trainable: bool | None = None

    def __post_init__(self) -> None:
        if self.constraint is not None:
            constraint = _constraint.as_constraint(self.constraint, "ParamSpec")
            object.__setattr__(self, "constraint", constraint)
        if self.trainable is not None and not isinstance(self.trainable, bool):
            raise TypeError(
                f"ParamSpec: `trainable` must be bool or None, got {self.trainable!r}."
            )
        if self.bijector is not None:
            _constraint.as_transform(self.bijector, "ParamSpec: `bijector`")
        if self.prior is not None and not hasattr(self.prior, "log_prob"):
            raise TypeError(
                f"ParamSpec: the prior {self.prior!r} has no `log_prob`. Use a "
                "distribution (distrax, TFP, numpyro), raw or in `ep.FixedDistrax`."
            )

    def merged(self, base: ParamSpec | None) -> ParamSpec:
        """This spec over `base`: each attribute from `self` where set, else from
        `base` (an override merged over a field's own metadata)."""
        set_here = {k: v for k, v in vars(self).items() if v is not None}
        return self if base is None else dataclasses.replace(base, **set_here)

    @property
    def annotated(self) -> bool:
        """Whether the spec changes the parameterisation (bijector or constraint)."""
        return self.bijector is not None or self.constraint is not None

    @property
    def is_trainable(self) -> bool:
        return self.trainable is not False

    def transform(self) -> Any:
        """`bijector`, else the constraint's default bijector, else the identity."""
        if self.bijector is not None:
            return _constraint.as_transform(self.bijector, "ParamSpec")
        if self.constraint is not None:
            return _constraint.default_bijector(self.constraint)
        return _transforms.Identity()

    @property
    def probe(self) -> bool:
        """Whether the bijector was chosen by hand for a constraint (then its
        range is checked against the constraint)."""
        return self.bijector is not None and self.constraint is not None


def field(
    *,
    bijector: Any = None,
    constraint: Constraint | None = None,
    prior: Any = None,
    trainable: bool | None = None,
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
    spec = ParamSpec(bijector, constraint, prior, trainable)
    metadata = {**(kwargs.pop("metadata", None) or {}), _METADATA_KEY: spec}
    return eqx.field(metadata=metadata, **kwargs)


# --- traversal ------------------------------------------------------------------


def label_of(path: tuple) -> str:
    return jtu.keystr(path).lstrip(".") or "(root)"


def _metadata_specs(model: Any, paths: list) -> list[ParamSpec | None]:
    """The innermost field metadata along each path (a field's metadata annotates
    its subtree; nothing is read below a custom node)."""
    specs = []
    for path in paths:
        spec, node = None, model
        for key in path:
            if isinstance(key, jtu.GetAttrKey):
                f = getattr(type(node), "__dataclass_fields__", {}).get(key.name)
                spec = getattr(f, "metadata", {}).get(_METADATA_KEY) or spec
                node = step(node, key.name)
            elif isinstance(key, (jtu.SequenceKey, jtu.DictKey)):
                node = node[key.idx if isinstance(key, jtu.SequenceKey) else key.key]
            else:
                break
        specs.append(spec)
    return specs


def unparameterized(model: Any) -> list[str]:
    """Labels of the float arrays of `model` that `ep.parameterize` would change
    but that are held raw: declared with a constraint or bijector other than the
    identity, or with `trainable=False`. Nothing is read below a node whose class
    sets `unconstrained_inside = True` (a guide keeps unconstrained values)."""

    def stop(x: Any) -> bool:
        return _parameter.is_node(x) or getattr(type(x), "unconstrained_inside", False)

    pairs = jtu.tree_flatten_with_path(model, is_leaf=stop)[0]
    paths = [path for path, x in pairs if eqx.is_inexact_array(x)]

    def kept(spec: ParamSpec) -> bool:  # `ep.parameterize` leaves the leaf as it is
        return spec.is_trainable and isinstance(spec.transform(), _transforms.Identity)

    specs = zip(paths, _metadata_specs(model, paths))
    return [label_of(path) for path, s in specs if s is not None and not kept(s)]


def entries(
    model: Any, overrides: Any, is_item: Callable = _parameter.is_node
) -> tuple[list, Any]:
    """`(path, spec, item)` for every leaf or parameter node of `model` (one
    flatten, nodes, or what `is_item` accepts, as single items), and the treedef.
    An override selecting a node is merged over the spec of every item below it,
    deeper ones last."""
    pairs, treedef = jtu.tree_flatten_with_path(model, is_leaf=is_item)
    for path, x in pairs:
        fields = getattr(type(x), "__dataclass_fields__", {}).values()
        if any(_METADATA_KEY in f.metadata for f in fields):
            name = type(x).__name__
            raise TypeError(
                f"`{label_of(path)}` is a {name}, a dataclass that JAX sees as one "
                "leaf, so its `ep.field` metadata is never read. Make it an Equinox "
                f"module: `class {name}(eqx.Module)`."
            )
    paths = [path for path, _ in pairs]
    specs = _metadata_specs(model, paths)
    found: dict[tuple, tuple[str, ParamSpec]] = {}
    for where, spec in WhereDict(() if overrides is None else overrides).where_items():
        label = where_labels(where)
        if not isinstance(spec, ParamSpec):
            raise TypeError(
                f"overrides[{label!r}] must be an `ep.ParamSpec`, got "
                f"{type(spec).__name__}."
            )
        path = tuple(where_paths(where, model, is_leaf=_parameter.is_node))
        if path in found:
            raise ValueError(
                f"overrides[{label!r}] and overrides[{found[path][0]!r}] select the "
                f"same node `{label_of(path)}`. Give it one entry."
            )
        found[path] = (label, spec)
    for prefix, (_, spec) in sorted(found.items(), key=lambda e: len(e[0])):
        for i, path in enumerate(paths):
            if tuple(path[: len(prefix)]) == prefix:
                specs[i] = spec.merged(specs[i])
    return [(p, spec, x) for p, spec, (_, x) in zip(paths, specs, pairs)], treedef


def _map(
    model: Any, overrides: Any, leaf: Callable, node: Callable | None = None, fill=None
) -> PyTree:
    """`leaf(label, spec, x)` at every leaf and `node(label, spec, x)` at every
    parameter node (without `node`, each leaf inside it becomes `fill`), rebuilt
    with `model`'s structure."""
    node = node or (lambda label, spec, x: jtu.tree_map(lambda _: fill, x))
    items, treedef = entries(model, overrides)
    out = [
        (node if _parameter.is_node(x) else leaf)(label_of(path), spec, x)
        for path, spec, x in items
    ]
    return jtu.tree_unflatten(treedef, out)


def _named(label: str) -> str:
    return f"Parameter `{label}`"


def is_parameter_leaf(
    spec: ParamSpec | None, label: str, leaf: Any
) -> TypeGuard[ParamSpec]:
    """Whether `spec` reparameterises `leaf`; a `TypeError` for a spec on a leaf
    that cannot carry it (an integer array, a Python number)."""
    if spec is None or not spec.annotated:
        return False
    check_trained(label, leaf, "a constraint or bijector")
    return True


def check_trained(label: str, leaf: Any, what: str) -> None:
    """A `TypeError` if `leaf`, annotated with `what`, is not a real float array:
    it would never be trained."""
    if eqx.is_inexact_array(leaf):
        if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
            raise TypeError(f"Parameter `{label}` must be real, not {leaf.dtype}.")
        return
    kind = f"a Python {type(leaf).__name__}"
    if eqx.is_array(leaf):
        kind = f"an array of dtype {leaf.dtype}"
    raise TypeError(
        f"Parameter `{label}` has {what} but is {kind}, which is never trained "
        "(Python numbers are static, integer arrays have no gradient). Pass a "
        f"float array: `jnp.asarray({label}, float)`, or drop its annotation."
    )


def _check_node(label: str, spec: ParamSpec | None, node: Any) -> Any:
    """`node`, in an annotated field: its value must lie in the constraint, and so
    must its bijector's outputs near its parameter (training moves it)."""
    if spec is not None and spec.constraint is not None:
        named = _named(label)
        _constraint.validate(spec.constraint, _parameter.resolve(node), named)
        if _parameter.is_bijector(node) and eqx.is_inexact_array(node.param):
            transform = _parameter.resolve(node.transform)
            _parameter.probe_range(transform, node.param, spec.constraint, named)
    return node


def _raw(label: str, spec: ParamSpec, x: Any, transform: Any) -> Any:
    """`x` in unconstrained space (checked against the constraint)."""
    return _parameter.to_unconstrained(
        x, transform, spec.constraint, _named(label), probe=spec.probe
    )


def spec_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the `ParamSpec` (or `None`) of each leaf.

    Specs come from `ep.field` metadata (a field annotates every leaf below it;
    the innermost annotation wins) and from `overrides`, a `WhereDict` (or dict)
    from where-functions or labels to `ParamSpec`s, merged attribute by attribute
    over the metadata (an override's set attributes win; deeper overrides are
    merged last). Two overrides selecting one node are an error. Leaves inside an
    `ep.Bijector` or `ep.Frozen` node get `None`: metadata stops at nodes.

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
    return _map(model, overrides, lambda label, spec, leaf: spec)


def bijector_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the bijector of each leaf.

    Unannotated leaves (and leaves inside parameter nodes) get the identity
    bijector. See `ep.spec_tree` for how specs are found.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), merged over field metadata.

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
    identity = _transforms.Identity()

    def leaf(label: str, spec: ParamSpec | None, x: Any) -> Any:
        return spec.transform() if is_parameter_leaf(spec, label, x) else identity

    return _map(model, overrides, leaf, fill=identity)


def prior_tree(model: PyTree, overrides: Any = None) -> PyTree:
    """A tree of the model's structure with the prior of each leaf (`None` if none).

    Leaves inside parameter nodes get `None` (`ep.log_prior` scores a node's
    resolved value with its field's prior).

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), merged over field metadata.

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
    return _map(model, overrides, lambda label, spec, x: getattr(spec, "prior", None))


def unconstrain(model: PyTree, overrides: Any = None) -> PyTree:
    """Map every annotated parameter to unconstrained space (the bijector's inverse).

    A value outside its constraint's support, outside its bijector's range, or too
    close to the boundary to be represented raises `ValueError` naming its path,
    e.g. `kernels[0].lengthscale` (under `jit`: an `eqx.error_if` with the same
    message). `ep.constrain` is the exact inverse. Parameter nodes (`ep.Bijector`,
    `ep.Frozen`) are already unconstrained: they are returned unchanged, after
    checking their value against the field's constraint.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), merged over field metadata.

    **Raises:**

    `ValueError` as above; `TypeError` for a bijector without an inverse (a plain
    callable) or a constraint on a leaf that is not a float array.

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

    def leaf(label: str, spec: ParamSpec | None, x: Any) -> Any:
        if not is_parameter_leaf(spec, label, x):
            return x
        return _raw(label, spec, x, spec.transform())

    return _map(model, overrides, leaf, _check_node)


def constrain(raw_model: PyTree, overrides: Any = None) -> PyTree:
    """Map every annotated parameter from unconstrained space (the bijector's forward).

    Call it at the top of a loss on a model produced by `ep.unconstrain`, so that
    gradients live in unconstrained space. Parameter nodes are returned unchanged.

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

    def leaf(label: str, spec: ParamSpec | None, u: Any) -> Any:
        if not is_parameter_leaf(spec, label, u):
            return u
        transform = spec.transform()
        if spec.probe and spec.constraint is not None:
            _parameter.probe_range(transform, u, spec.constraint, _named(label))
        return _errors.as_float(_transforms.forward(transform, u), label)

    return _map(raw_model, overrides, leaf, lambda label, spec, x: x)


def parameterize(model: PyTree, overrides: Any = None) -> PyTree:
    """Turn annotated parameters into `ep.Bijector` nodes, frozen ones into `ep.Frozen`.

    `ep.resolve(ep.parameterize(m))` equals `m`; `ep.trainable` then selects exactly
    the unconstrained parameters that should train. Idempotent: a node already in
    a field is kept (after checking its value against the field's constraint) and
    only wrapped in `ep.Frozen` if the field says `trainable=False`.

    **Arguments:**

    - `model`: any PyTree, typically an `eqx.Module` with `ep.field` metadata.
    - `overrides`: optional `{where: ParamSpec}` (a `WhereDict` or a dict keyed by
      where-functions or labels), merged over field metadata.

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
    assert ep.parameterize(model) == model
    ```
    """

    def one(label: str, spec: ParamSpec | None, x: Any) -> Any:
        if _parameter.is_node(x):
            _check_node(label, spec, x)
        elif is_parameter_leaf(spec, label, x):
            transform = spec.transform()
            x = _parameter.Bijector(_raw(label, spec, x, transform), transform)
        if spec is None or spec.is_trainable or isinstance(x, _parameter.Frozen):
            return x
        return _parameter.frozen(x) if eqx.is_array(x) or _parameter.is_node(x) else x

    return _map(model, overrides, one, one)


def log_prior(model: PyTree, overrides: Any = None) -> Float[Array, ""]:
    """Sum of the prior log-densities of the (constrained) parameters.

    Parameter nodes are scored at their resolved (constrained) value, so
    `log_prior(ep.parameterize(m)) == log_prior(m)`. A value outside a prior's
    support scores `-inf` (not NaN, not the density's formula continued). Each
    parameter is scored in its own dtype (a float32 prior's arrays are cast for a
    float64 parameter, and back), and the terms are summed in the widest of their
    dtypes, at least float32.

    **Arguments:**

    - `model`: a model holding constrained values or parameter nodes; leaves
      without a prior contribute nothing.
    - `overrides`: optional `{where: ParamSpec}`, as for `ep.spec_tree`.

    **Returns:**

    A scalar.

    **Raises:**

    `ValueError` naming the parameter if the prior's batch shape does not fit the
    parameter's (a scalar parameter under a prior of batch shape `(3,)` would be
    counted three times).

    **Example:**

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
    constrained = ep.log_prior(params)                         # log p(lengthscale)
    unconstrained = constrained + ep.log_det_jacobian(params)  # log p(u)
    ```
    """
    terms = [
        score_prior(label_of(path), spec.prior, _parameter.resolve(item))
        for path, spec, item in entries(model, overrides)[0]
        if spec is not None and spec.prior is not None
    ]
    if not terms:
        return jnp.zeros(())
    # Summed in the widest dtype among the terms (no implicit promotion).
    dtype = max((t.dtype for t in terms), key=lambda d: np.dtype(d).itemsize)
    return functools.reduce(jnp.add, [t.astype(dtype) for t in terms])


def in_dtype(prior: Any, dtype: Any) -> Any:
    """`prior` with its float arrays in `dtype`, so a parameter is scored in its
    own precision: a float32 prior (say built at import, before x64 was enabled)
    never silently promotes a float64 parameter's log-density, nor a float64
    prior a float32 one. A raw prior that needs a cast is wrapped first (so that
    what it computes from its arguments is computed in `dtype`); one that cannot
    be wrapped is cast as the PyTree it is, its cached arrays included."""

    def cast(x: Any) -> bool:
        floating = eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating)
        return floating and x.dtype != dtype

    if not any(map(cast, jtu.tree_leaves(prior))):
        return prior
    with contextlib.suppress(TypeError):
        prior = FixedDistrax.from_instance(prior)
    return jtu.tree_map(lambda x: x.astype(dtype) if cast(x) else x, prior)


def score_prior(label: str, prior: Any, value: Any) -> Array:
    """`sum(prior.log_prob(value))`, `-inf` outside the prior's support, after
    checking that the prior's shapes fit the parameter's (it must not count an
    entry twice)."""
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.floating):
        prior = in_dtype(prior, value.dtype)
    event = tuple(as_tuple(prior.event_shape))
    if value.ndim < len(event) or value.shape[value.ndim - len(event) :] != event:
        raise ValueError(
            f"The prior of `{label}` has event shape {event}, but the parameter "
            f"has shape {value.shape}. Give the prior the parameter's event shape."
        )
    batch = value.shape[: value.ndim - len(event)]
    try:
        ok = _support.in_support(prior, value)
        # Outside the support (known eagerly): -inf whatever the density says,
        # and the library is not asked (numpyro warns, TFP with validate_args
        # raises); only the shape of its answer is needed, for the check below.
        outside = ok is not None and not _errors.is_traced(ok) and not np.all(ok)
        lp = jax.eval_shape(prior.log_prob, value) if outside else prior.log_prob(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"The prior of `{label}` cannot score the parameter (shape {value.shape}): "
            f"{e}. Give the prior the parameter's shape (or a scalar one)."
        ) from e
    if not _errors.broadcasts_to(jnp.shape(lp), batch):
        raise ValueError(
            f"The prior of `{label}` gives log-densities of shape {lp.shape} for a "
            f"parameter of batch shape {batch}, so it would count the parameter more "
            "than once. Give the prior the parameter's shape (or a scalar one)."
        )
    # Summed in at least float32 (bfloat16 and float16 lose whole units over a
    # few hundred terms), `-inf` outside the support.
    dtype = lp.dtype if np.dtype(lp.dtype).itemsize >= 4 else jnp.float32
    if outside:
        return jnp.full((), -jnp.inf, dtype)
    return jnp.sum(lp if ok is None else jnp.where(ok, lp, -jnp.inf), dtype=dtype)
