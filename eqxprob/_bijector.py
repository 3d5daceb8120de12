"""Constrained parameters: `Bijector` and `Frozen` nodes, resolved in the forward pass.

A `Bijector` holds an unconstrained array `param` (what the optimiser sees) and a
`transform`; `resolve(tree)` replaces every such node by `transform(param)`,
innermost first, as paramax's `unwrap` does. `Frozen` nodes resolve to their value
with `stop_gradient`, and `trainable(tree)` is the filter spec that keeps optimisers
(weight decay included) away from frozen values and from a transform's own arrays.

The shortcuts (`positive`, `bounded`, `lower_cholesky`, `simplex`) use the small
pure-JAX bijectors below rather than `FixedDistrax(tfb.Softplus)` & co.: they agree
with TFP to rounding (see the tests) but trace about four times faster, which
counts in models with thousands of parameters (`benchmarks/resolve.py`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import distrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jaxtyping import Array, ArrayLike, PyTree

from ._wrappers import FixedDistrax, tfb


# ------------------------------------------------------------ built-in bijectors


def _newton(forward: Callable, slope: Callable, x: Array, y: Array) -> Array:
    """One Newton step on `forward(x) = y`, with the inverse's own gradient.

    In float32 a closed-form inverse is off by about one ulp of `x`, which is up to
    1e-6 relative in `forward(x)`; the step brings it to half an ulp.
    """
    step = (forward(x) - y) / slope(x)
    return x - jax.lax.stop_gradient(jnp.where(jnp.isfinite(step), step, 0))


def _inverse_softplus(y: Array) -> Array:
    # log(expm1(y)) overflows for large y; this form is exact from 1e-30 to 1e30.
    x = y + jnp.log(-jnp.expm1(-y))
    return _newton(jax.nn.softplus, jax.nn.sigmoid, x, y)


class _Softplus(eqx.Module):
    """`x ↦ log(1 + eˣ)`, onto (0, ∞)."""

    def forward(self, x: Array) -> Array:
        return jax.nn.softplus(x)

    def inverse(self, y: Array) -> Array:
        return _inverse_softplus(y)

    def forward_log_det_jacobian(self, x: Array) -> Array:
        return jax.nn.log_sigmoid(x)


class _Interval(eqx.Module):
    """`x ↦ high·σ(x) + low·σ(-x)`, onto (low, high); exact near either bound."""

    low: Array
    high: Array

    def forward(self, x: Array) -> Array:
        return self.high * jax.nn.sigmoid(x) + self.low * jax.nn.sigmoid(-x)

    def inverse(self, y: Array) -> Array:
        x = jnp.log(y - self.low) - jnp.log(self.high - y)
        return _newton(self.forward, self._slope, x, y)

    def _slope(self, x: Array) -> Array:
        return (self.high - self.low) * jax.nn.sigmoid(x) * jax.nn.sigmoid(-x)

    def forward_log_det_jacobian(self, x: Array) -> Array:
        width = jnp.log(self.high - self.low)
        return width + jax.nn.log_sigmoid(x) + jax.nn.log_sigmoid(-x)


def _tril_layout(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-major lower-triangle indices of an `n × n` matrix, and the diagonal's
    positions among them."""
    rows, cols = np.tril_indices(n)
    return rows, cols, np.flatnonzero(rows == cols)


def _side(m: int) -> int:
    """`n` such that `m = n(n+1)/2`."""
    n = int(np.sqrt(8 * m + 1) - 1) // 2
    if n * (n + 1) // 2 != m:
        raise ValueError(
            f"lower_cholesky: the parameter's last axis has {m} entries, which is "
            "not n(n+1)/2 for any n; build it with `ep.lower_cholesky(L)`."
        )
    return n


class _LowerCholesky(eqx.Module):
    """A vector of `n(n+1)/2` reals ↦ lower-triangular `n × n`, positive diagonal.

    The vector holds the lower triangle row by row (`L[0,0], L[1,0], L[1,1],
    L[2,0], ...`), with softplus applied to the diagonal entries.
    """

    def forward(self, x: Array) -> Array:
        x = jnp.asarray(x)
        n = _side(x.shape[-1])
        rows, cols, diag = _tril_layout(n)
        x = x.at[..., diag].set(jax.nn.softplus(x[..., diag]))
        return jnp.zeros((*x.shape[:-1], n, n), x.dtype).at[..., rows, cols].set(x)

    def inverse(self, y: Array) -> Array:
        rows, cols, diag = _tril_layout(y.shape[-1])
        x = jnp.asarray(y)[..., rows, cols]
        return x.at[..., diag].set(_inverse_softplus(x[..., diag]))

    def forward_log_det_jacobian(self, x: Array) -> Array:
        diag = _tril_layout(_side(x.shape[-1]))[2]
        return jnp.sum(jax.nn.log_sigmoid(x[..., diag]), axis=-1)


class _SoftmaxCentered(eqx.Module):
    """`x ∈ ℝⁿ⁻¹ ↦ softmax([x, 0])` on the open simplex, as `tfb.SoftmaxCentered`."""

    def forward(self, x: Array) -> Array:
        return jax.nn.softmax(_append_zero(x), axis=-1)

    def inverse(self, y: Array) -> Array:
        return jnp.log(y[..., :-1] / y[..., -1:])

    def forward_log_det_jacobian(self, x: Array) -> Array:
        # log|det| of x ↦ y[:-1] is sum(log y); TFP adds the constant 0.5 log n.
        n = x.shape[-1] + 1
        logy = jax.nn.log_softmax(_append_zero(x), axis=-1)
        return jnp.sum(logy, axis=-1) + 0.5 * np.log(n).astype(x.dtype)


def _append_zero(x: Array) -> Array:
    return jnp.concatenate([x, jnp.zeros((*x.shape[:-1], 1), x.dtype)], axis=-1)


# ------------------------------------------------------------------- transforms


class _Held:
    """A static transform, compared and hashed by `key` rather than by identity."""

    __slots__ = ("value", "key")

    def __init__(self, value: Any, key: Any):
        self.value = value
        self.key = key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Held) and self.key == other.key

    def __repr__(self) -> str:
        value = self.value
        if isinstance(value, distrax.Bijector):
            return f"distrax.{type(value).__name__}()"
        return getattr(value, "__qualname__", None) or repr(value)


class _Static(eqx.Module):
    """A transform without arrays (a function, a raw distrax bijector), as static."""

    held: _Held = eqx.field(static=True)


# Transforms that hold no `Bijector` or `Frozen` nodes (`FixedDistrax` holds arrays).
_NODE_FREE = (_Softplus, _LowerCholesky, _SoftmaxCentered, _Static, FixedDistrax)


def _distrax_key(bijector: distrax.Bijector) -> Any:
    """Class and attributes, recursively; `None` if it holds arrays."""

    def freeze(x: Any) -> Any:
        if isinstance(x, distrax.Bijector):
            return (type(x), tuple((k, freeze(v)) for k, v in sorted(vars(x).items())))
        if isinstance(x, (list, tuple)):
            return (type(x), tuple(map(freeze, x)))
        if isinstance(x, dict):
            return (dict, tuple((k, freeze(v)) for k, v in sorted(x.items())))
        if eqx.is_array(x):
            raise TypeError
        return (type(x), x)

    try:
        key = freeze(bijector)
        hash(key)
    except TypeError:
        return None
    return key


def _from_tfp(bijector: tfb.Bijector) -> FixedDistrax:
    """Rebuild a raw TFP bijector as a `FixedDistrax` from its `.parameters`."""

    def convert(x: Any) -> Any:
        return _from_tfp(x) if isinstance(x, tfb.Bijector) else x

    is_raw = lambda x: isinstance(x, tfb.Bijector)
    kwargs = jtu.tree_map(convert, dict(bijector.parameters), is_leaf=is_raw)
    return FixedDistrax(type(bijector), **kwargs)


def _as_transform(transform: Any) -> Any:
    """Store a transform so that it is a proper pytree, or static and hashable."""
    name = type(transform).__name__
    if isinstance(transform, _Static):
        return transform
    if isinstance(transform, FixedDistrax) and transform.is_distribution:
        raise TypeError(
            f"Bijector: the transform {transform!r} wraps a distribution; pass a "
            "bijector, e.g. `ep.FixedDistrax(tfb.Softplus)`."
        )
    if isinstance(transform, tfb.Bijector):
        return _from_tfp(transform)
    if isinstance(transform, distrax.Bijector):
        key = _distrax_key(transform)
        if key is None:
            raise TypeError(
                f"Bijector: the raw distrax.{name} holds arrays (or unhashable "
                "values), which would be hidden from JAX. Wrap it: "
                f"`ep.FixedDistrax(distrax.{name}, ...)` with its constructor "
                "arguments."
            )
        return _Static(_Held(transform, key))
    if not (callable(transform) or hasattr(transform, "forward")):
        raise TypeError(
            "Bijector: the transform must be a bijector (`ep.FixedDistrax`, a "
            f"distrax or TFP bijector) or a callable, got {transform!r}."
        )
    if isinstance(transform, eqx.Module) or jtu.tree_leaves(transform) != [transform]:
        return transform  # a pytree, e.g. `ep.FixedDistrax`: its leaves stay leaves
    try:
        hash(transform)
    except TypeError:
        raise TypeError(
            f"Bijector: the callable transform of type {name} is not hashable, so "
            "it cannot be static. Use a function or an `eqx.Module`."
        ) from None
    return _Static(_Held(transform, transform))


def _method(transform: Any, name: str, action: str) -> Callable[[Array], Array]:
    if isinstance(transform, _Static):
        transform = transform.held.value
    if isinstance(transform, eqx.Module):
        # Equinox builds a bound-method object at each access; this is cheaper.
        function = getattr(type(transform), name, None)
        if inspect.isfunction(function):
            return functools.partial(function, transform)
    method = getattr(transform, name, None)
    if method is None:
        if name == "forward" and callable(transform):
            return transform
        raise TypeError(
            f"the transform {transform!r} has no `{name}` method, so it cannot "
            f"{action}. Use a bijector (`ep.FixedDistrax(tfb.Softplus)`, a raw "
            "distrax or TFP bijector, or an `eqx.Module` with `forward`, "
            "`inverse` and `forward_log_det_jacobian` methods)."
        )
    return method


# ---------------------------------------------------------------------- checks


def _as_float(x: ArrayLike) -> Array:
    """An inexact array with a concrete (non-weak) dtype, so `jit` never retraces.

    Python and NumPy input is converted on the host: eager JAX operations compile
    once per shape, which makes building many small parameters slow.
    """
    if isinstance(x, jax.Array):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return x.astype(jnp.result_type(float))
        return x.astype(x.dtype) if x.weak_type else x
    x = np.asarray(x)
    x = x if np.issubdtype(x.dtype, np.inexact) else x.astype(float)
    return jnp.asarray(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype))


def _host(x: Any) -> Any:
    """A NumPy copy of a concrete value, for checks that compile nothing."""
    return x if isinstance(x, jax.core.Tracer) else np.asarray(x)


def _short(x: Any) -> str:
    """A value for a message, in its own dtype's shortest form (`0.1`, not
    `0.10000000149011612`)."""
    if isinstance(x, jax.core.Tracer):
        return "(traced)"
    x = np.asarray(x)
    if x.ndim == 0:
        return str(x[()])
    return np.array2string(x, threshold=6, separator=", ").replace("\n", "")


def _entries(name: str, x: Any, bad: np.ndarray, limit: int = 3) -> str:
    """`value[1] = -0.5, value[3] = 0.0`: the entries of `x` where `bad`."""
    if bad.ndim == 0:
        return f"{name} = {_short(x)}"
    x = np.broadcast_to(np.asarray(x), bad.shape)
    index = np.argwhere(bad)
    shown = [f"{name}{list(map(int, i))} = {x[tuple(i)]}" for i in index[:limit]]
    more = f" (and {len(index) - limit} more)" if len(index) > limit else ""
    return ", ".join(shown) + more


def _check(x: Array, bad: Any, what: str, fix: str, shown: Any = None) -> Array:
    """Return `x`, or raise where `bad` (computed from `_host` values).

    With concrete values a `ValueError` names the offending entries of `shown`
    (a `(name, array)` pair, default `("value", x)`, or a ready string). Under a
    JAX transformation, `eqx.error_if` checks at run time instead: keep the
    returned `x`, or the check is dropped.
    """
    if isinstance(bad, jax.core.Tracer):
        return eqx.error_if(x, jnp.any(bad), f"{what}. {fix}")
    bad = np.asarray(bad)
    if bad.any():
        if not isinstance(shown, str):
            name, array = shown or ("value", x)
            shown = _entries(name, array, bad)
        raise ValueError(f"{what}, but {shown}. {fix}")
    return x


# ---------------------------------------------------------------------- nodes


def _check_positive(x: Array, what: str, fix: str) -> Array:
    """`_check` that every entry of `x` is finite and > 0."""
    v = _host(x)
    return _check(x, ~((v > 0) & (v < np.inf)), what, fix)


class Bijector(eqx.Module):
    """A constrained parameter: an unconstrained array and a transform.

    `ep.resolve` replaces the node by `transform(param)` (`transform.forward` for
    bijectors); optimisers act on `param`, which may take any real value. Build
    one from a constrained value with `Bijector.from_value` or a shortcut
    (`ep.positive`, `ep.bounded`, `ep.lower_cholesky`, `ep.simplex`).

    How `transform` is stored:

    - an `eqx.Module` (such as `ep.FixedDistrax(tfb.Softplus)`) as is: its arrays
      are leaves, which `ep.trainable` marks as not trainable;
    - a raw TFP bijector is rebuilt as a `FixedDistrax` from its `.parameters`;
    - a raw distrax bijector without arrays (`distrax.Sigmoid()`, `distrax.Tanh()`)
      and a plain callable are static, compared by value for distrax (class and
      attributes) and by identity for callables: use a module-level function
      rather than a fresh `lambda`, or every new one compiles anew. A raw distrax
      bijector with arrays is rejected: wrap it in `ep.FixedDistrax`.

    A Python or integer `param` becomes an array of the default float dtype, never
    weakly typed, so a jitted training step compiles once. `param` may also be a
    PyTree holding further `Bijector` or `Frozen` nodes; these resolve first.

    **Arguments:**

    - `param`: the unconstrained array (or a PyTree resolving to one).
    - `transform`: a bijector or a callable, as above.

    **Example:**

    ```python
    import jax.numpy as jnp
    from tensorflow_probability.substrates.jax import bijectors as tfb
    import eqxprob as ep

    scale = ep.Bijector(jnp.array(0.0), tfb.Exp())
    assert ep.resolve(scale) == 1.0
    ```
    """

    param: Any
    transform: Any

    def __init__(self, param: Any, transform: Any):
        self.param = _as_float(param) if eqx.is_array_like(param) else param
        self.transform = _as_transform(transform)

    @classmethod
    def from_value(cls, value: ArrayLike, transform: Any) -> Bijector:
        """Build from a constrained value, through the transform's inverse.

        **Arguments:**

        - `value`: the constrained value, which becomes `transform.inverse(value)`.
        - `transform`: a bijector, as for `Bijector`.

        **Raises:**

        `ValueError` naming the offending entries if the inverse is not finite
        there, i.e. the value is outside the transform's range (under `jax.jit` or
        `jax.vmap`, an `eqx.error_if` check instead); `TypeError` if the
        transform has no `inverse`.

        **Example:**

        ```python
        from tensorflow_probability.substrates.jax import bijectors as tfb
        import eqxprob as ep

        scale = ep.Bijector.from_value(2.0, tfb.Exp())
        assert abs(ep.resolve(scale) - 2.0) < 1e-6
        ```
        """
        transform = _as_transform(transform)
        value = _as_float(value)
        _method(resolve(transform), "inverse", "invert a value")  # or TypeError
        param = _inverse(transform, value)
        p = _host(param)
        bad = ~(abs(p) < np.inf)  # not finite
        if param.shape != value.shape:  # entries do not correspond: show it all
            bad = bad.any()
        param = _check(
            param,
            bad,
            "Bijector.from_value: the value is outside the range of the transform "
            f"{transform!r} (its inverse is not finite there)",
            "Pass a value inside the transform's range.",
            ("value", value),
        )
        return cls(param, transform)


@eqx.filter_jit  # one compilation per shape, rather than one per operation
def _inverse(transform: Any, value: Array) -> Array:
    return _method(resolve(transform), "inverse", "invert a value")(value)


class Frozen(eqx.Module):
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


def _is_node(x: Any) -> bool:
    return isinstance(x, (Bijector, Frozen))


def _stop_gradient(x: Any) -> Any:
    return jax.lax.stop_gradient(x) if eqx.is_array(x) else x


def _resolve_node(x: Any) -> Any:
    if isinstance(x, Bijector):
        forward = _method(_resolve_inner(x.transform), "forward", "resolve")
        return forward(_resolve_inner(x.param))
    if isinstance(x, Frozen):
        return jtu.tree_map(_stop_gradient, resolve(x.value))
    return x


def _resolve_inner(tree: Any) -> Any:
    # A fast path for trees that cannot hold nodes; `resolve` is traced per node.
    if eqx.is_array(tree) or isinstance(tree, _NODE_FREE):
        return tree
    return resolve(tree)


def resolve(tree: PyTree) -> PyTree:
    """Replace every `Bijector` and `Frozen` node in `tree` by its value.

    A `Bijector` becomes `transform(param)`, a `Frozen` its value with
    `jax.lax.stop_gradient`. Nodes nested inside a node's `param`, `transform` or
    `value` resolve first (innermost first). Call it at the top of a forward
    pass: `self = ep.resolve(self)`. After `jax.jit` it costs nothing beyond the
    transforms themselves. Idempotent.

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
    return jtu.tree_map(_resolve_node, tree, is_leaf=_is_node)


resolve_all_bijectors = resolve


def trainable(tree: PyTree) -> PyTree[bool]:
    """A filter spec: `True` exactly where an optimiser should act.

    That is at the `param` of every `Bijector` and at floating-point arrays
    outside any node; `False` inside `Frozen` nodes, at a transform's own arrays
    (bounds, shifts, scales) and at non-float leaves. The result has the structure
    of `tree`, so `eqx.partition(tree, ep.trainable(tree))` splits off exactly the
    trained part: gradients, optimiser state and weight decay never reach the
    rest. (`eqx.is_inexact_array` would let weight decay move frozen values.)

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
    return _trainable(tree, True)


def _trainable(tree: PyTree, default: bool) -> PyTree[bool]:
    def spec(x: Any) -> Any:
        if isinstance(x, Frozen):
            return jtu.tree_map(lambda _: False, x)
        if isinstance(x, Bijector):
            treedef = jtu.tree_structure(x, is_leaf=lambda y: y is not x)
            children = [_trainable(x.param, True), _trainable(x.transform, False)]
            return jtu.tree_unflatten(treedef, children)
        return default and eqx.is_inexact_array(x)

    return jtu.tree_map(spec, tree, is_leaf=_is_node)


def log_det_jacobian(tree: PyTree) -> Array:
    """The sum of `log|det J|` of every `Bijector`'s forward map at its `param`.

    With it, a density over the constrained values becomes one over the
    unconstrained parameters: `log_prior(ep.resolve(m)) + ep.log_det_jacobian(m)`,
    for MAP or MCMC in unconstrained space. A `Bijector` nested in another's
    `param` contributes its own term (the chain rule); `Bijector`s inside `Frozen`
    nodes are constants and contribute nothing.

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
    for node in jtu.tree_leaves(tree, is_leaf=_is_node):
        if isinstance(node, Bijector):  # `Frozen` nodes are constants: skipped
            _log_dets(node.param, terms)
            _log_dets(node.transform, terms)
            terms.append(_log_det(resolve(node.transform), resolve(node.param)))


def _log_det(transform: Any, x: Array) -> Array:
    method = _method(transform, "forward_log_det_jacobian", "give a log-det-Jacobian")
    log_det = method(x)
    # TFP returns a constant Jacobian's log-det unbroadcast (`tfb.Scale(3.)` gives
    # log 3 for any x): broadcast it over the batch before summing.
    held = transform.held.value if isinstance(transform, _Static) else transform
    for name in ("forward_min_event_ndims", "event_ndims_in"):  # TFP, distrax
        event_ndims = getattr(held, name, None)
        if isinstance(event_ndims, int):
            batch = x.shape[: x.ndim - event_ndims]
            log_det = jnp.broadcast_to(
                log_det, jnp.broadcast_shapes(batch, log_det.shape)
            )
            break
    return jnp.sum(log_det)


# ------------------------------------------------------------------- shortcuts


def positive(value: ArrayLike) -> Bijector:
    """A positive parameter: `softplus(param)`, built from its value.

    The inverse softplus is computed as `y + log(-expm1(-y))`, exact across float64
    (1e-30 to 1e30) and float32 (1e-6 to 1e6), with finite gradients.

    **Arguments:**

    - `value`: the positive value(s), finite and `> 0`.

    **Raises:**

    `ValueError` naming the entries that are not finite and positive.

    **Example:**

    ```python
    import eqxprob as ep

    scale = ep.positive(2.0)
    assert abs(ep.resolve(scale) - 2.0) < 1e-6
    ```
    """
    value = _as_float(value)
    value = _check_positive(
        value,
        "ep.positive: the value must be finite and > 0 (softplus reaches 0 only at "
        "-inf)",
        "Pass a positive value, e.g. `jnp.maximum(value, 1e-6)`.",
    )
    return Bijector.from_value(value, _Softplus())


def bounded(value: ArrayLike, low: ArrayLike, high: ArrayLike) -> Bijector:
    """A parameter in the open interval `(low, high)`: a sigmoid, then affine.

    Resolves to `high·σ(param) + low·σ(-param)`. `low` and `high` become the
    transform's own arrays (in `value`'s dtype), which `ep.trainable` marks as not
    trainable. The interval is **open**: the sigmoid reaches a bound only at
    ±inf, so a value equal to a bound is rejected. Values near a bound round-trip
    to rounding relative to the bounds' magnitude.

    **Arguments:**

    - `value`: the value(s), strictly inside `(low, high)`.
    - `low`, `high`: finite bounds with `low < high`, broadcastable with `value`.

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
    value = _as_float(value)
    low, high = jnp.asarray(low, value.dtype), jnp.asarray(high, value.dtype)
    v, lo, hi = _host(value), _host(low), _host(high)
    low = _check(
        low,
        ~((-np.inf < lo) & (lo < hi) & (hi < np.inf)),
        "ep.bounded: the bounds must be finite with low < high",
        "Swap or fix the bounds.",
        f"(low, high) = ({_short(low)}, {_short(high)})",
    )
    value = _check(
        value,
        ~((lo < v) & (v < hi)),
        f"ep.bounded: the value must lie strictly inside the open interval "
        f"(low, high) = ({_short(low)}, {_short(high)})",
        "The sigmoid reaches a bound only at ±inf: move the value inside, or widen "
        "the bounds.",
    )
    return Bijector.from_value(value, _Interval(low, high))


def lower_cholesky(value: ArrayLike) -> Bijector:
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
    diagonal entry that is not finite and positive, naming the entries.

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
    value = _as_float(value)
    if value.ndim < 2 or value.shape[-1] != value.shape[-2]:
        raise ValueError(
            "ep.lower_cholesky: expected a square matrix or a batch of them, of "
            f"shape (..., n, n), but the value has shape {value.shape}."
        )
    v = _host(value)
    upper = np.triu(np.ones(value.shape[-2:], bool), 1)
    value = _check(
        value,
        upper & (v != 0),
        "ep.lower_cholesky: the value must be lower-triangular",
        "Pass `jnp.tril(value)`, or a Cholesky factor (`jnp.linalg.cholesky`).",
    )
    diagonal = np.eye(value.shape[-1], dtype=bool)
    value = _check(
        value,
        diagonal & ~((v > 0) & (v < np.inf)),
        "ep.lower_cholesky: the diagonal must be finite and > 0",
        "Multiply each column whose diagonal entry is negative by -1, which leaves "
        "`L @ L.T` unchanged.",
    )
    return Bijector.from_value(value, _LowerCholesky())


def simplex(value: ArrayLike) -> Bijector:
    """A probability vector: positive entries summing to 1 along the last axis.

    Resolves to `softmax([param, 0])`, as `tfb.SoftmaxCentered`: `param` has one
    entry fewer than `value`. The simplex is **open**: the softmax reaches 0 only
    at -inf, so a zero entry is rejected.

    **Arguments:**

    - `value`: shape `(..., n)`, entries finite and `> 0`, summing to 1 within
      the square root of the dtype's machine epsilon.

    **Raises:**

    `ValueError` naming the offending entries or sums.

    **Example:**

    ```python
    import jax.numpy as jnp
    import eqxprob as ep

    probs = ep.simplex(jnp.array([0.2, 0.3, 0.5]))
    assert probs.param.shape == (2,)
    assert jnp.allclose(ep.resolve(probs), jnp.array([0.2, 0.3, 0.5]))
    ```
    """
    value = _as_float(value)
    if value.ndim < 1 or value.shape[-1] < 1:
        raise ValueError(
            "ep.simplex: expected a vector (or a batch of them) of shape (..., n) "
            f"with n >= 1, but the value has shape {value.shape}."
        )
    value = _check_positive(
        value,
        "ep.simplex: the entries must be finite and > 0 (the softmax reaches 0 only "
        "at -inf)",
        "Mix in a little of the uniform distribution: `(1 - eps) * value + eps / n`.",
    )
    v = _host(value)
    total = v.sum(-1)
    tol = float(np.sqrt(jnp.finfo(value.dtype).eps))
    value = _check(
        value,
        ~(abs(total - 1) <= tol),
        f"ep.simplex: the entries must sum to 1 along the last axis (within {tol:.1g})",
        "Normalise it: `value / value.sum(-1, keepdims=True)`.",
        ("value.sum(-1)", total),
    )
    return Bijector.from_value(value, _SoftmaxCentered())
