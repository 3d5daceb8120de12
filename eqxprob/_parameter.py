"""Constrained parameters: `Bijector` and `Frozen` nodes, resolved in the forward pass.

A `Bijector` holds an unconstrained array `param` (what the optimiser sees) and a
`transform`; `resolve(tree)` replaces every such node by `transform(param)`,
innermost first, as paramax's `unwrap` does. `Frozen` nodes resolve to their value
with `stop_gradient`, and `trainable(tree)` is the filter spec that keeps optimisers
(weight decay included) away from frozen values and from a transform's own arrays.

`to_unconstrained` is the one path from a constrained value to its parameter: the
shortcuts (`positive`, `bounded`, ...), `Bijector.from_value` and the registry
(`ep.unconstrain`, `ep.parameterize`) all call it.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import wadler_lindig as wl
from jaxtyping import Array, ArrayLike, Float, PyTree, Real

from . import _constraint, _errors, _node, _transforms
from ._constraint import Constraint
from ._node import Node, is_node


# ---------------------------------------------------------------- the one path


def to_unconstrained(
    value: ArrayLike,
    transform: Any,
    constraint: Constraint | None,
    name: str,
    *,
    probe: bool = False,
) -> Array:
    """The unconstrained parameter of `value`: checked, inverted, checked again.

    1. `value` must lie in `constraint` (`ValueError` naming `name`);
    2. `transform`'s inverse must be finite there (else the value is outside the
       bijector's range);
    3. `transform(inverse(value))` must lie in `constraint` again, so a value the
       dtype cannot represent through the bijector (softplus underflows below
       ~1e-38 in float32) is an error rather than a parameter that resolves to 0;
    4. with `probe=True` (a bijector given explicitly alongside a constraint) the
       bijector's outputs near the parameter must lie in the constraint too, so a
       bijector whose range leaves its constraint is caught.

    Checks become `eqx.error_if`s with the same messages under `jit`.
    """
    value = _errors.as_float(value, name)
    if constraint is not None:
        value = _constraint.validate(constraint, value, name)
    if not _transforms.has_inverse(transform):
        _transforms.inverse(transform, value, name)  # raises the TypeError
    param, back, near = eqx.filter_jit(_round_trip)(transform, value, probe)
    bijector = f"the bijector {_transforms.describe(transform)}"
    whole = f"value = {_errors.short(value)}"  # where entries do not correspond
    param = _errors.check_finite(
        param,
        f"{name}: the value is outside the range of {bijector}",
        "Pass a value inside the bijector's range, or choose another bijector.",
        ("value", value) if param.shape == value.shape else whole,
    )
    v, b = _errors.host(value), _errors.host(back)
    missed = _transforms.round_trip_error(transform, v, b)
    if missed is not None:
        what = f"{name} cannot be represented in {value.dtype} by {bijector}"
        fix = "Use a value further from the boundary, or float64."
        param = _errors.check(param, missed, what, fix, ("value", value))
    if constraint is None:
        return param
    shown = f"{name} = {_errors.short(value)}"
    what = (
        f"{name} cannot be represented through {bijector}: mapped back, it leaves "
        f"{constraint!r} (a value too close to the boundary for the dtype)"
    )
    fix = "Move the value further inside the support, or use float64."
    param = _errors.check(param, ~_constraint.holds(constraint, back), what, fix, shown)
    if near is None:
        return param
    return _check_range(param, near, transform, constraint, name, shown)


def probe_range(
    transform: Any, param: Array, constraint: Constraint, name: str
) -> None:
    """Eagerly check that `transform`'s outputs near `param` lie in `constraint`."""
    if not _errors.is_traced(param):
        near = np.asarray(_near(transform, param))
        shown = f"{name} (unconstrained) = {_errors.short(param)}"
        _check_range(param, near, transform, constraint, name, shown)


def _check_range(
    param: Array, near: Any, transform: Any, constraint: Constraint, name: str, got: str
) -> Array:
    """`param`, checked: `transform`'s outputs `near` it must lie in `constraint`
    (`got` names the value in the message)."""
    return _errors.check(
        param,
        ~_constraint.holds(constraint, near),
        f"{name} has the bijector {_transforms.describe(transform)}, whose range "
        f"leaves its constraint {constraint!r}",
        "Pass a bijector onto the support, or drop `bijector=` for the default.",
        got,
    )


_PROBES = np.array([-10.0, -1.0, 1.0, 10.0])


def _near(transform: Any, param: Array) -> Array:
    shifts = jnp.asarray(_PROBES, param.dtype).reshape((-1,) + (1,) * param.ndim)
    return jax.vmap(lambda p: _transforms.forward(transform, p))(param + shifts)


def _round_trip(transform: Any, value: Array, probe: bool) -> tuple:
    # Always compiled (`to_unconstrained` wraps it in `eqx.filter_jit`), so an
    # eager parameter equals the one made under `jit` bit for bit: op-by-op XLA
    # rounds differently near the dtype's smallest normal number.
    param = _transforms.inverse(transform, value, "")
    back = _transforms.forward(transform, param)
    near = _near(transform, param) if probe else None
    return param, back, near


# ---------------------------------------------------------------------- nodes


class Bijector(Node):
    """A constrained parameter: an unconstrained array and a transform.

    `ep.resolve` replaces the node by `transform(param)` (the bijector's `forward`
    or the callable itself), so gradients and optimisers act on the unconstrained
    `param`. Use it as a leaf anywhere in a model.

    Using a node as an array (`jnp.asarray(node)`, `node + 1`) is a `TypeError`
    that says to call `ep.resolve` first.

    **Arguments:**

    - `param`: the unconstrained array (finite), a nested node, or a PyTree of
      those (given to the transform whole, as paramax's `Parameterize`).
    - `transform`: an `ep.FixedDistrax` bijector, a raw TFP bijector (stored as a
      `FixedDistrax`), a raw distrax bijector without arrays (e.g.
      `distrax.Sigmoid()`), a built-in bijector from `ep.default_bijector`, or a
      plain callable (forward only: no `inverse`, no log-det).

    **Raises:**

    `ValueError` if `param` is not finite; `TypeError` for a transform that is
    none of the above.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    scale = ep.Bijector(jnp.array(0.0), jax.nn.softplus)
    assert jnp.allclose(ep.resolve(scale), jnp.log(2.0))
    ```
    """

    param: Any
    transform: Any

    def __init__(self, param: Any, transform: Any):
        self.transform = _constraint.as_transform(transform, "ep.Bijector")
        if not _is_array_like(param):
            leaves = jtu.tree_leaves(param, is_leaf=is_node)
            if not leaves or not all(eqx.is_array(x) or is_node(x) for x in leaves):
                raise TypeError(
                    "ep.Bijector: `param` must be an array, a nested node or a PyTree "
                    f"of those, got {type(param).__name__}. For a constrained value, "
                    "use `ep.Bijector.from_value(value, transform)`."
                )
            self.param = param  # a PyTree (paramax style): its leaves stay
            return
        param = _errors.as_float(param, "ep.Bijector: `param`")
        self.param = _errors.check_finite(
            param,
            "ep.Bijector: `param` (the unconstrained value) must be finite",
            "Build it with `ep.Bijector.from_value` or a shortcut like `ep.positive`.",
            ("param", param),
        )

    @classmethod
    def from_value(
        cls,
        value: Real[ArrayLike, "*shape"],
        transform: Any = None,
        *,
        constraint: Any = None,
    ) -> Bijector:
        """Build a `Bijector` from a constrained `value`, via the inverse.

        **Arguments:**

        - `value`: the constrained value.
        - `transform`: as for `ep.Bijector`, with an `inverse`. Defaults to
          `ep.default_bijector(constraint)`.
        - `constraint`: optional `ep.constraints` member the value must lie in.

        **Raises:**

        `ValueError` if `value` is outside `constraint` or outside the transform's
        range (its inverse is not finite there), or if it cannot be represented
        through the transform in its dtype; `TypeError` if the transform has no
        inverse. Under `jit` the same checks run as `eqx.error_if`.

        **Example:**

        ```python
        from tensorflow_probability.substrates.jax import bijectors as tfb
        import eqxprob as ep

        scale = ep.Bijector.from_value(2.0, tfb.Exp())
        assert abs(ep.resolve(scale) - 2.0) < 1e-6
        ```
        """
        return _from_value(value, constraint, "Bijector.from_value", transform)

    def unwrap(self) -> Any:
        return _transforms.forward(resolve(self.transform), resolve(self.param))

    def _unresolved(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_UNRESOLVED)

    # Use as an array, arithmetic included, is a `TypeError` that names the fix.
    __jax_array__ = __array__ = _unresolved
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _unresolved
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __matmul__ = _unresolved
    __rmatmul__ = __neg__ = __abs__ = __floordiv__ = __rfloordiv__ = _unresolved
    __lt__ = __le__ = __gt__ = __ge__ = __float__ = __getitem__ = _unresolved

    def _shown(self) -> Any:
        """The constrained value for display, or `None` to show the fields (a
        filter spec, a traced parameter, a transform that fails)."""
        if not eqx.is_inexact_array(self.param) or _errors.is_traced(self.param):
            return None
        try:
            return resolve(self)
        except Exception:  # noqa: BLE001 - shown as its fields instead
            return None

    def __pdoc__(self, **kwargs: Any) -> wl.AbstractDoc | None:
        """`Bijector(2.24, softplus)`: the constrained value and the transform."""
        value = self._shown()
        if value is None:
            return None  # Equinox's default: the fields
        small = np.size(value) <= 4
        doc = wl.TextDoc(_errors.display(value)) if small else wl.pdoc(value, **kwargs)
        docs = [doc, wl.TextDoc(_transforms.describe(self.transform))]
        begin, end = wl.TextDoc("Bijector("), wl.TextDoc(")")
        return wl.bracketed(begin, docs, wl.comma, end, kwargs.get("indent", 2))

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """The constrained value and the transform in treescope (its optional
        protocol; imported only when treescope calls this)."""
        value = self._shown()
        if value is None:
            return NotImplemented  # treescope's default: the fields
        from treescope import repr_lib

        attributes = {"value": value, "transform": _transforms.describe(self.transform)}
        return repr_lib.render_object_constructor(
            type(self), attributes, path=path, subtree_renderer=subtree_renderer
        )


_UNRESOLVED = (
    "An `ep.Bijector` node is not an array: call `ep.resolve` first "
    "(`model = ep.resolve(model)` at the top of the forward pass)."
)


def _is_array_like(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return all(map(_is_array_like, x))
    return isinstance(x, (jax.Array, np.ndarray, np.generic, float, int))


def _from_value(value: Any, constraint: Any, name: str, transform=None) -> Bijector:
    probe = transform is not None and constraint is not None  # a bijector by hand
    if constraint is not None:
        constraint = _constraint.as_constraint(constraint, name)
    if transform is None:
        if constraint is None:
            raise TypeError(f"{name}: pass a `transform` or a `constraint`.")
        transform = _constraint.default_bijector(constraint)
    transform = _constraint.as_transform(transform, name)
    param = to_unconstrained(value, transform, constraint, name, probe=probe)
    return Bijector(param, transform)


class Frozen(Node):
    """A value that is not trained: it resolves with `jax.lax.stop_gradient`.

    `ep.resolve` replaces the node by its (resolved) value with gradients stopped;
    `ep.trainable` marks everything inside as not trainable, so with
    `eqx.partition(model, ep.trainable(model))` neither gradients nor weight decay
    reach it. `ep.log_det_jacobian` leaves out the `Bijector`s inside it: they are
    constants, not coordinates of the unconstrained space.

    **Arguments:**

    - `value`: any PyTree, e.g. an array or a `Bijector`.

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    grad = jax.grad(lambda x: ep.resolve(ep.Frozen(x)) ** 2)(jnp.array(3.0))
    assert grad == 0.0
    ```
    """

    value: Any

    def unwrap(self) -> Any:
        stop = lambda x: jax.lax.stop_gradient(x) if eqx.is_array(x) else x  # noqa: E731
        return jtu.tree_map(stop, resolve(self.value))


def frozen(value: Any) -> Frozen:
    """Freeze `value`: shorthand for `ep.Frozen(value)`.

    **Example:**

    ```python
    import eqxprob as ep

    noise = ep.frozen(ep.positive(0.1))
    assert ep.trainable(noise).value.param is False
    ```
    """
    return Frozen(value)


def is_bijector(x: Any) -> bool:
    """Whether `x` is a `Bijector` node; use it as `is_leaf` in `jtu.tree_map`.

    **Example:**

    ```python
    import jax.tree_util as jtu
    import eqxprob as ep

    model = {"scale": ep.positive(1.0), "n": 3}
    nodes = jtu.tree_leaves(model, is_leaf=ep.is_bijector)
    assert sum(map(ep.is_bijector, nodes)) == 1
    ```
    """
    return isinstance(x, Bijector)


def resolve(tree: PyTree) -> PyTree:
    """Replace every `Bijector` and `Frozen` node in `tree` by its value.

    A `Bijector` becomes `transform(param)`, a `Frozen` its value with
    `jax.lax.stop_gradient`. Nodes nested inside a node's `param`, `transform` or
    `value` resolve first (innermost first). paramax wrappers (GPJax 1.0's
    parameters among them) resolve too, with `paramax.unwrap`. Call it at the top
    of a forward pass: `self = ep.resolve(self)`. After `jax.jit` it costs nothing
    beyond the transforms themselves. Idempotent.

    **Arguments:**

    - `tree`: any PyTree; other nodes and leaves are returned unchanged.

    **Returns:**

    A PyTree of the same structure with values in place of the nodes.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    model = {"scale": ep.positive(2.0), "shift": jnp.array(1.0)}
    values = ep.resolve(model)
    assert jnp.allclose(values["scale"], 2.0) and values["shift"] == 1.0
    ```
    """
    return _node.resolve(tree)


def trainable(tree: PyTree) -> PyTree[bool]:
    """A filter spec: `True` exactly where an optimiser should act.

    `True` at the `param` of every `Bijector` and at floating-point arrays
    outside any node; `False` inside `Frozen` nodes (and paramax's
    `NonTrainable`, so GPJax-frozen values stay frozen), at a transform's own arrays
    (bounds, shifts, scales) and at non-float leaves. The result has the structure
    of `tree`, so `eqx.partition(tree, ep.trainable(tree))` splits off exactly the
    trained part: gradients, optimiser state and weight decay never reach the
    rest. (`eqx.is_inexact_array` would let weight decay move frozen values.)
    `ep.partition(tree)` is the same split in one call.

    Every other float array is trained, including the arrays of a `FixedDistrax`
    stored in the model (say a prior's `loc` and `scale`): wrap such objects in
    `ep.frozen` to keep them fixed.

    **Arguments:**

    - `tree`: any PyTree.

    **Returns:**

    A PyTree of bools with the structure of `tree`.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    model = {"x": ep.bounded(0.5, 0.0, 1.0), "noise": ep.frozen(jnp.array(0.1))}
    params, static = eqx.partition(model, ep.trainable(model))
    assert params["x"].param is not None and params["x"].transform.low is None
    assert params["noise"].value is None
    ```
    """
    return _mask(tree, True)


def partition(tree: PyTree) -> tuple[PyTree, PyTree]:
    """`eqx.partition(tree, ep.trainable(tree))`: the trained part and the rest.

    Recombine with `eqx.combine`.

    **Arguments:**

    - `tree`: any PyTree.

    **Returns:**

    `(trained, rest)`: `tree` with `None` at every leaf `ep.trainable` marks
    `False`, and `tree` with `None` at every leaf it marks `True`.

    **Example:**

    ```python
    import equinox as eqx
    import jax.numpy as jnp
    import eqxprob as ep

    model = {"x": ep.positive(2.0), "noise": ep.frozen(jnp.array(0.1))}
    params, static = ep.partition(model)
    assert params["noise"].value is None and static["x"].param is None
    assert eqx.tree_equal(eqx.combine(params, static), model)
    ```
    """
    return eqx.partition(tree, trainable(tree))


def _mask(tree: PyTree, default: bool) -> PyTree[bool]:
    """`trainable`'s mask, `default` at float leaves outside any node."""
    module = _node.paramax()
    frozen = (Frozen,) if module is None else (Frozen, module.NonTrainable)
    nodes = (Bijector, *frozen)

    def spec(x: Any) -> Any:
        if isinstance(x, Bijector):  # the param trains, the transform's arrays not
            masks = jtu.tree_leaves(_mask(x.param, True))
            masks += jtu.tree_leaves(_mask(x.transform, False))
            return jtu.tree_unflatten(jtu.tree_structure(x), masks)
        if isinstance(x, frozen):
            return jtu.tree_map(lambda _: False, x)
        return default and eqx.is_inexact_array(x)

    return jtu.tree_map(spec, tree, is_leaf=lambda x: isinstance(x, nodes))


def log_det_jacobian(tree: PyTree) -> Float[Array, ""]:
    """The sum of `log|det J|` of every `Bijector`'s forward map at its `param`.

    With it, a density over the constrained values becomes one over the
    unconstrained parameters: `log_prior(ep.resolve(m)) + ep.log_det_jacobian(m)`,
    for MAP or MCMC in unconstrained space. Each term is taken with respect to the
    constrained distribution's own measure (a simplex's first `n - 1`
    coordinates, a Cholesky factor's lower triangle, ...), so a prior pushed back
    integrates to one. A `Bijector` nested in another's `param` contributes its
    own term (the chain rule); `Bijector`s inside `Frozen` nodes are constants and
    contribute nothing.

    **Arguments:**

    - `tree`: any PyTree.

    **Returns:**

    A scalar array; zero if `tree` holds no `Bijector`.

    **Raises:**

    `TypeError` if a transform (e.g. a plain callable) has no
    `forward_log_det_jacobian`.

    **Example:**

    ```python
    import jax
    import eqxprob as ep

    scale = ep.positive(2.0)
    expected = jax.nn.log_sigmoid(scale.param)  # softplus' = sigmoid
    assert abs(ep.log_det_jacobian(scale) - expected) < 1e-6
    ```
    """
    terms: list[Array] = []
    _log_dets(tree, terms)
    return sum(terms[1:], terms[0]) if terms else jnp.zeros(())


def _log_dets(tree: PyTree, terms: list[Array]) -> None:
    for node in jtu.tree_leaves(tree, is_leaf=is_node):
        if isinstance(node, Bijector):  # `Frozen` nodes are constants: skipped
            _log_dets(node.param, terms)
            _log_dets(node.transform, terms)
            transform, x = resolve(node.transform), resolve(node.param)
            terms.append(jnp.sum(_transforms.log_det(transform, x, "log_det_jacobian")))


# ------------------------------------------------------------------- shortcuts


def positive(value: Real[ArrayLike, "*shape"]) -> Bijector:
    """A positive parameter: `softplus(param)`, built from its value.

    The inverse softplus is computed as `y + log(-expm1(-y))`, exact across float64
    (1e-30 to 1e30) and float32 (1e-6 to 1e6), with finite gradients.

    **Arguments:**

    - `value`: the positive value(s), finite and `> 0`.

    **Raises:**

    `ValueError` naming the entries that are not finite and positive, or too small
    to be represented through softplus in their dtype.

    **Example:**

    ```python
    import eqxprob as ep

    scale = ep.positive(2.0)
    assert abs(ep.resolve(scale) - 2.0) < 1e-6
    ```
    """
    return _from_value(value, _constraint.positive, "ep.positive")


def nonnegative(value: Real[ArrayLike, "*shape"]) -> Bijector:
    """A non-negative parameter (zero allowed): `softplus(param)`.

    Zero maps to the parameter of the dtype's smallest normal number, so it
    resolves to almost zero: at most a few times that number (3.2e-38 in float32,
    with XLA's `exp` flushing below it), not exactly 0. Values from about
    `1e4 · tiny / eps` up round-trip to rounding.

    **Example:**

    ```python
    import eqxprob as ep

    jitter = ep.nonnegative(0.0)
    assert 0 <= ep.resolve(jitter) < 1e-30
    ```
    """
    return _from_value(value, _constraint.nonnegative, "ep.nonnegative")


def bounded(
    value: Real[ArrayLike, "*#shape"],
    low: Real[ArrayLike, "*#shape"],
    high: Real[ArrayLike, "*#shape"],
) -> Bijector:
    """A parameter in the open interval `(low, high)`: a sigmoid, then affine.

    Resolves to `high·σ(param) + low·σ(-param)`. `low` and `high` become the
    transform's own arrays, which `ep.trainable` marks as not trainable. The
    interval is **open**: the sigmoid reaches a bound only at ±inf, so a value
    equal to a bound is rejected. An infinite bound gives a one-sided parameter
    (`low + softplus` or `high - softplus`).

    **Arguments:**

    - `value`: the value(s), strictly inside `(low, high)`.
    - `low`, `high`: bounds with `low < high`, broadcastable with `value`.

    **Raises:**

    `ValueError` naming the offending entries if `low < high` fails or the value
    is not strictly inside.

    **Example:**

    ```python
    import eqxprob as ep

    p = ep.bounded(0.25, 0.0, 1.0)
    assert abs(ep.resolve(p) - 0.25) < 1e-6
    ```
    """
    value = _errors.as_float(value, "ep.bounded")
    low = _errors.as_float(low, "ep.bounded: `low`").astype(value.dtype)
    high = _errors.as_float(high, "ep.bounded: `high`").astype(value.dtype)
    try:
        np.broadcast_shapes(value.shape, low.shape, high.shape)
    except ValueError:
        raise ValueError(
            f"ep.bounded: the value {value.shape}, `low` {low.shape} and `high` "
            f"{high.shape} must broadcast together; give scalars or the value's shape."
        ) from None
    if not (_errors.is_traced(low) or _errors.is_traced(high)):
        low, high = np.asarray(low), np.asarray(high)
    return _from_value(value, _constraint.interval(low, high), "ep.bounded")


def lower_cholesky(value: Real[ArrayLike, "*batch n n"]) -> Bijector:
    """A lower-triangular matrix with a positive diagonal, e.g. a Cholesky factor.

    **Parameter layout:** `param` is a vector of the `n(n+1)/2` lower-triangle
    entries, row by row (`L[0,0], L[1,0], L[1,1], L[2,0], ...`), with diagonal
    entries through the inverse softplus; a batch of matrices `(..., n, n)` gives
    `(..., n(n+1)/2)`. So every parameter is a real degree of freedom (no ignored
    upper triangle), as MCMC in unconstrained space needs.

    **Arguments:**

    - `value`: a lower-triangular `(..., n, n)` matrix with a finite, positive
      diagonal.

    **Raises:**

    `ValueError` for another shape, a non-zero entry above the diagonal, or a
    diagonal entry that is not finite and positive, naming the matrices.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    L = jnp.linalg.cholesky(jnp.array([[2.0, 0.5], [0.5, 1.0]]))
    chol = ep.lower_cholesky(L)
    assert chol.param.shape == (3,)
    assert jnp.allclose(ep.resolve(chol), L, atol=1e-6)
    ```
    """
    return _from_value(value, _constraint.lower_cholesky, "ep.lower_cholesky")


def positive_definite(value: Real[ArrayLike, "*batch n n"]) -> Bijector:
    """A covariance matrix: symmetric positive-definite, resolved as `L Lᵀ`.

    `param` holds the `n(n+1)/2` entries of `L = cholesky(value)` as for
    `ep.lower_cholesky`; the log-det is with respect to the matrix's lower
    triangle (the convention of Wishart densities).

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    cov = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    node = ep.positive_definite(cov)
    assert node.param.shape == (3,)
    assert jnp.allclose(ep.resolve(node), cov, atol=1e-5)
    ```
    """
    return _from_value(value, _constraint.positive_definite, "ep.positive_definite")


def corr_cholesky(value: Real[ArrayLike, "*batch n n"]) -> Bijector:
    """The Cholesky factor of a correlation matrix (the support of an LKJ prior).

    `param` holds `n(n-1)/2` reals; row `i` of the factor is `[zᵢ, 1] / ‖[zᵢ, 1]‖`.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    corr = jnp.array([[1.0, 0.3], [0.3, 1.0]])
    node = ep.corr_cholesky(jnp.linalg.cholesky(corr))
    assert node.param.shape == (1,)
    L = ep.resolve(node)
    assert jnp.allclose(L @ L.T, corr, atol=1e-5)
    ```
    """
    return _from_value(value, _constraint.corr_cholesky, "ep.corr_cholesky")


def simplex(value: Real[ArrayLike, "*batch n"]) -> Bijector:
    """A probability vector: positive entries summing to 1 along the last axis.

    Resolves to `softmax([param, 0])`, as `tfb.SoftmaxCentered`: `param` has one
    entry fewer than `value`. The simplex is **open**: the softmax reaches 0 only
    at -inf, so a zero entry is rejected.

    **Arguments:**

    - `value`: shape `(..., n)`, entries finite and `> 0`, summing to 1 within
      the square root of the dtype's machine epsilon.

    **Raises:**

    `ValueError` naming the offending vectors.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    probs = ep.simplex(jnp.array([0.2, 0.3, 0.5]))
    assert probs.param.shape == (2,)
    assert jnp.allclose(ep.resolve(probs), jnp.array([0.2, 0.3, 0.5]))
    ```
    """
    return _from_value(value, _constraint.simplex, "ep.simplex")
