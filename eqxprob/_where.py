"""Where-functions as labels: record what a where-function selects.

A where-function such as `lambda m: m.kernel.lengthscale` (as taken by
`eqx.tree_at`) is called here on a *recorder*, a stand-in for the tree whose
attribute and item accesses return new recorders that remember the access chain.
That gives a label (`"kernel.lengthscale"`) without any tree and without reading
bytecode. Every call records afresh, so a label follows what the function reads
at that call. Labels parse back into where-functions, so a label and a
where-function name the same node; key paths, `WhereDict` and `tree_at_all`
build on these labels.
"""

from __future__ import annotations

import ast
import contextlib
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import PyTree


Where = Callable[[Any], Any]
# A parsed label: one `(kind, key)` per access, kind "." (attribute) or "[]" (item).
_Steps = tuple[tuple[str, Any], ...]

_ALLOWED = (
    "A where-function may only select parts of its argument, by attribute access "
    "(`s.a`), integer index (`s.b[0]`) or string key (`s.c['k']`), and return the "
    "selections alone or in a tuple, list or dict, as for `eqx.tree_at`."
)
_TOKEN = re.compile(
    r"""\.?([^.\[]+)|\[(-?\d+)\]|\[('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")\]"""
)


# --------------------------------------------------------------------- recording


class _Recorder:
    """Stands in for the tree and records the accesses a where-function makes.

    Every attribute access goes through `__getattribute__`, so that no selected
    name is shadowed by an attribute of the recorder itself (its `label` slot,
    `__doc__`, methods), and dunders are refused.
    """

    __slots__ = ("label",)

    def __init__(self, label: str):
        self.label = label

    def __getattribute__(self, name: str) -> Any:
        label = _label_of(self)
        if not name.isidentifier() or name.startswith("__") and name.endswith("__"):
            if name == "__class__":  # for `isinstance`
                return _Recorder
            raise _misuse(label, f"the attribute {name!r}")
        return _Recorder(f"{label}.{name}" if label else name)

    def __getitem__(self, key: Any) -> _Recorder:
        label = _label_of(self)
        if type(key) is str:
            return _Recorder(f"{label}[{key!r}]")
        with contextlib.suppress(TypeError):  # a forbidden `__index__` included
            if not isinstance(key, bool):
                return _Recorder(f"{label}[{operator.index(key)}]")
        raise _misuse(label, f"the key {key!r} (use an int or a str)")

    def __repr__(self) -> str:
        return f"<selection {_label_of(self)!r}>"


def _label_of(recorder: _Recorder) -> str:
    return object.__getattribute__(recorder, "label")


def _misuse(label: str, what: str) -> TypeError:
    selection = f"the selection {label!r}" if label else "its argument"
    return TypeError(f"{_ALLOWED} This one used {what} on {selection}.")


def _forbid(what: str) -> Callable[..., Any]:
    def method(self: _Recorder, *args: Any, **kwargs: Any) -> Any:
        raise _misuse(_label_of(self), what)

    return method


# Every operation but selecting, by dunder names (each also `r` and `i` for the
# binary arithmetic ones), and how a message names it.
_BINARY = "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and or xor"
for _names, _what in {
    "neg pos abs invert": "arithmetic",
    " ".join(f"{o} r{o} i{o}" for o in _BINARY.split()): "arithmetic",
    "eq ne lt le gt ge": "a comparison",
    "hash": "hashing",
    "bool": "truth testing (`if`, `and`, `or`, `not`)",
    "len": "`len`",
    "iter reversed contains": "iteration or `in`",
    "call": "a call",
    "int float complex index round trunc floor ceil": "a conversion to a number",
    "str format bytes": "a conversion to a string",
    "setitem delitem": "item assignment",
}.items():
    for _name in _names.split():
        setattr(_Recorder, f"__{_name}__", _forbid(_what))


def _is_recorder(x: Any) -> bool:
    return type(x) is _Recorder


def _label_leaf(x: Any) -> str:
    if _is_recorder(x):
        return _label_of(x)
    what = f"returned a {type(x).__name__} instead of a selection"
    raise TypeError(f"{_ALLOWED} This one {what}.")


# ------------------------------------------------------------------------ labels


def _render(steps: _Steps) -> str:
    return "".join(
        f"[{key!r}]" if kind == "[]" else f".{key}" if i else key
        for i, (kind, key) in enumerate(steps)
    )


def _parse(label: str) -> _Steps:
    steps, pos = [], 0
    while pos < len(label):
        match = _TOKEN.match(label, pos)
        if match is None:
            raise ValueError(
                f"Cannot parse the label {label!r} at position {pos}: write attributes "
                "joined by dots, `[0]` for indices, `['k']` for keys: \"a.b[0]['k']\"."
            )
        name, index, string = match.groups()
        if name is not None and not name.isidentifier():
            raise ValueError(f"{name!r} in the label {label!r} is not a Python name.")
        key = name or (int(index) if index else ast.literal_eval(string))
        steps.append((".", key) if name else ("[]", key))
        pos = match.end()
    canonical = _render(tuple(steps))
    if canonical != label:
        raise ValueError(f"{label!r} is not a label as written; write {canonical!r}.")
    return tuple(steps)


def step(tree: Any, name: str) -> Any:
    """What a key path's `.name` reaches in `tree`: an Equinox module's field as
    stored (a property of the same name may shadow it), else the attribute (a
    wrapper's argument of that name)."""
    if issubclass(type(tree), eqx.Module):
        fields = object.__getattribute__(tree, "__dict__")
        if name in fields:
            return fields[name]
    return getattr(tree, name)


def _as_where(label: Where | str) -> Where:
    """A where-function as it is, or one parsed from a label."""
    if not isinstance(label, str):
        return label
    steps = _parse(label)

    def where(tree: Any) -> Any:
        for kind, key in steps:
            tree = step(tree, key) if kind == "." else tree[key]
        return tree

    where.__qualname__ = where.__name__ = f"where_{label!r}"
    return where


def where_labels(where: Where | str) -> PyTree[str]:
    """The labels of what a where-function selects, without needing a tree.

    Attribute access gives `"a.b"`, an index `"b[0]"` and a string key
    `"c['k']"`. Labels are what was written: `"b[-1]"` stays negative. The
    identity `lambda s: s` selects the whole tree; its label is `""`, as
    `jax.tree_util.keystr(())`. A label parses back into a where-function, so
    labels may be used wherever where-functions are.

    `where` is called at every call of `where_labels`, so the label follows what
    it reads then: a closure variable, a default argument or a global index
    gives its current value, as calling `where` on a tree would.

    **Arguments:**

    - `where`: a function of one argument, as for `eqx.tree_at`, or a label (a
      string, returned unchanged after checking that it parses).

    **Returns:**

    A label for each selection, in a PyTree of the structure `where` returns.

    **Raises:**

    `TypeError` if `where` does anything but select (arithmetic, calls,
    comparisons, iteration, `bool`, `len`, ...) or returns something else than
    selections; `ValueError` for a string that is not a label.

    **Example:**

    ```python
    import eqxprob as ep

    assert ep.where_labels(lambda s: s.mechanics.effector) == "mechanics.effector"
    labels = ep.where_labels(lambda s: (s.a, s.b[0], s.c["k"]))
    assert labels == ("a", "b[0]", "c['k']")
    i = 0
    where = lambda s: s.layers[i]
    assert ep.where_labels(where) == "layers[0]"
    i = 2
    assert ep.where_labels(where) == "layers[2]"
    ```
    """
    if isinstance(where, str):
        _parse(where)
        return where
    if not callable(where):
        raise TypeError(
            "`where` must be a function such as `lambda m: m.a.b[0]` or a label "
            f"such as 'a.b[0]'; got a {type(where).__name__}."
        )
    out = where(_Recorder(""))
    if not jtu.tree_leaves(out, is_leaf=_is_recorder):
        raise TypeError(f"{_ALLOWED} This one selects nothing (it returned {out!r}).")
    return jtu.tree_map(_label_leaf, out, is_leaf=_is_recorder)


# ------------------------------------------------------------------------- paths


def _children(node: Any, is_leaf: Callable[[Any], bool] | None) -> list | None:
    """`(key, child)` pairs of one pytree node, or `None` if `node` is a leaf."""
    if is_leaf is not None and is_leaf(node):
        return None
    pairs, _ = jtu.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if len(pairs) == 1 and pairs[0][0] == ():
        return None
    return [(path[0], child) for path, child in pairs]


def _matches(key: Any, kind: str, want: Any) -> bool:
    if kind == ".":
        return type(key) is jtu.GetAttrKey and key.name == want
    if type(key) is jtu.DictKey:
        return type(key.key) is type(want) and key.key == want
    return type(key) is jtu.SequenceKey and key.idx == want


def _key_path(
    label: str, tree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[Any, ...]:
    steps = _parse(label)
    node, path = tree, []
    for i, (kind, want) in enumerate(steps):
        at = repr(_render(steps[:i])) if i else "the root"
        children = _children(node, is_leaf)
        if children is None:
            raise ValueError(
                f"`where` selects {label!r}, but the node at {at} is a leaf of "
                f"the tree (a {type(node).__name__}), and has no parts to select."
            )
        if type(want) is int and isinstance(node, (list, tuple)):
            # By position: resolves negative indices, and namedtuples' children
            # are keyed by field name.
            found = [children[want]] if -len(children) <= want < len(children) else []
        else:
            found = [(k, c) for k, c in children if _matches(k, kind, want)]
        if not found:
            step = _render(((kind, want),)) if kind == "[]" else repr(want)
            keys = ", ".join(jtu.keystr((k,)) for k, _ in children) or "none"
            raise ValueError(
                f"`where` selects {label!r}, but the tree has no such node: the "
                f"{type(node).__name__} at {at} has no pytree child {step} (children: "
                f"{keys}). Static fields, properties and methods are not pytree nodes."
            )
        key, node = found[0]
        path.append(key)
    return tuple(path)


def where_paths(
    where: Where | str, tree: Any, *, is_leaf: Callable[[Any], bool] | None = None
) -> PyTree[tuple[Any, ...]]:
    """The JAX key paths of the nodes a where-function selects in `tree`.

    Paths are derived from the recorded accesses, each checked against `tree`:
    an attribute becomes `jax.tree_util.GetAttrKey` (Equinox fields,
    namedtuples), a dict key `DictKey`, a list or tuple index `SequenceKey`
    (negative indices resolved). For leaves, these are the paths
    `jax.tree_util.tree_flatten_with_path` gives. Selected nodes need not be
    leaves, and a node and its own child may both be selected. Paths follow the
    accesses and never object identity: an array that appears at two places of
    `tree` gets, for each selection, the path of the place that selection names.

    **Arguments:**

    - `where`: a where-function or a label, as for `where_labels`.
    - `tree`: the PyTree to select from.
    - `is_leaf`: as for `jax.tree_util`: nodes it accepts are leaves, whose parts
      cannot be selected.

    **Returns:**

    A key path (a tuple of keys) for each selection, in a PyTree of the structure
    `where` returns.

    **Raises:**

    `ValueError` naming the label if a selection is not a node of `tree` (a
    missing attribute or key, a static field, or a part of a leaf); as
    `where_labels` for a `where` that does more than select.

    **Example:**

    ```python
    import jax.numpy as jnp
    import jax.tree_util as jtu
    import eqxprob as ep

    tree = {"a": [jnp.zeros(2), jnp.ones(3)]}
    paths = ep.where_paths(lambda t: (t["a"], t["a"][-1]), tree)
    assert paths == (
        (jtu.DictKey("a"),),
        (jtu.DictKey("a"), jtu.SequenceKey(1)),
    )
    ```
    """
    labels = where_labels(where)
    return jtu.tree_map(lambda label: _key_path(label, tree, is_leaf), labels)


# --------------------------------------------------------------------- WhereDict


def _key_label(key: Any) -> str:
    label = where_labels(key)
    if type(label) is not str:
        raise TypeError(
            "A WhereDict key must select a single node, but this where-function "
            f"selects {label!r}. Give each node its own entry."
        )
    return label


def _immutable(self: WhereDict, *args: Any, **kwargs: Any) -> Any:
    raise TypeError("A WhereDict is immutable. Build a new one: `d | {where: value}`.")


class WhereDict(dict):
    """An ordered, immutable mapping keyed by where-functions or their labels.

    A key may be given as a where-function or as its label, interchangeably:
    `d["foo.bar"] is d[lambda x: x.foo.bar]`, also for `in` and `get`. Each key
    selects one node. Iteration, `keys()` and `items()` give the labels, in
    insertion order; `wheres()` and `where_items()` give the where-functions for
    surgery (the original ones, or ones parsed from labels given as keys), as
    `tree_at_all` does.

    A `WhereDict` is a `dict` from labels to values; a where-function is looked
    up by its label at that call (see `where_labels`). It is immutable: build a
    new one to change it.

    **Arguments:**

    - `entries`: a mapping, or an iterable of `(key, value)` pairs, whose keys
      are where-functions or labels (see `where_labels`).

    **Raises:**

    `ValueError` naming the label if two keys have the same label; `TypeError`
    if a key selects more than one node. Looking up a missing key raises
    `KeyError` naming its label.

    **Example:**

    ```python
    import eqxprob as ep

    d = ep.WhereDict({lambda m: m.kernel.lengthscale: 1.0, "noise": 0.1})
    assert d["kernel.lengthscale"] == d[lambda m: m.kernel.lengthscale] == 1.0
    assert (lambda m: m.noise) in d
    assert list(d) == ["kernel.lengthscale", "noise"]
    ```
    """

    __slots__ = ("_keys",)
    _keys: dict[str, Where | str]

    def __init__(self, entries: Mapping[Any, Any] | Iterable[Any] = (), /):
        keys: dict[str, Where | str] = {}
        for entry in _pairs(entries):
            try:
                key, value = entry
            except (TypeError, ValueError):
                raise TypeError(
                    "WhereDict takes a mapping or an iterable of (key, value) "
                    f"pairs; got the entry {entry!r}."
                ) from None
            label = _key_label(key)
            if label in keys:
                raise ValueError(
                    f"Two WhereDict keys select {label!r}: {keys[label]!r} and "
                    f"{key!r}. Keep one entry per node."
                )
            keys[label] = key
            dict.__setitem__(self, label, value)
        self._keys = keys

    def __missing__(self, key: Any) -> Any:
        # Reached for every key but a label present.
        if isinstance(key, str):
            labels = ", ".join(map(repr, self)) or "none"
            raise KeyError(f"No entry for {key!r} in the WhereDict (labels: {labels}).")
        return self[_key_label(key)]

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key if type(key) is str else _key_label(key))

    def get(self, key: Any, default: Any = None) -> Any:
        """The value for `key` (a where-function or a label), else `default`, as
        `dict.get`: also for keys that are neither."""
        try:
            return self[key]
        except (KeyError, TypeError):
            return default

    def __or__(self, other: Any) -> WhereDict:
        if not isinstance(other, Mapping):
            return NotImplemented
        keys, values = dict(self._keys), dict(dict.items(self))  # by label, in order
        for key, value in _pairs(other):  # as `dict |`: the right side's values win
            label = _key_label(key)
            keys.setdefault(label, key)
            values[label] = value
        return WhereDict([(keys[label], values[label]) for label in keys])

    def __ror__(self, other: Any) -> WhereDict:
        return WhereDict(other) | self if isinstance(other, Mapping) else NotImplemented

    def wheres(self) -> tuple[Where, ...]:
        """The where-functions of the keys, in insertion order."""
        return tuple(map(_as_where, self._keys.values()))

    def where_items(self) -> tuple[tuple[Where, Any], ...]:
        """`(where-function, value)` pairs, in insertion order."""
        return tuple(zip(self.wheres(), self.values()))

    def copy(self) -> WhereDict:
        """A shallow copy, keeping the where-functions."""
        return WhereDict(self)

    @classmethod
    def fromkeys(cls, keys: Iterable[Any], value: Any = None) -> WhereDict:
        """A `WhereDict` with the given keys, all mapped to `value`."""
        return cls([(key, value) for key in keys])

    def __repr__(self) -> str:
        return f"WhereDict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return WhereDict, (list(zip(self._keys.values(), self.values())),)

    __setitem__ = __delitem__ = __ior__ = _immutable  # type: ignore
    clear = pop = popitem = setdefault = update = _immutable  # type: ignore


def _pairs(entries: Any) -> Iterable[Any]:
    """The `(key, value)` entries of a mapping (a `WhereDict`'s with its
    where-functions) or of an iterable of pairs."""
    if isinstance(entries, WhereDict):
        return entries.where_items()
    return entries.items() if isinstance(entries, Mapping) else entries


def _unflatten_where_dict(aux: tuple, values: Iterable[Any]) -> WhereDict:
    # Labels are known: skip the relabelling `__init__` does.
    new = dict.__new__(WhereDict)
    dict.update(new, zip([label for label, _ in aux], values))
    new._keys = dict(aux)
    return new


def _flatten_where_dict(d: WhereDict) -> tuple[list, tuple]:
    children = [(jtu.DictKey(label), value) for label, value in dict.items(d)]
    return children, tuple(d._keys.items())


# A pytree over its values (keyed by label), so `jax.jit`, `jax.grad` and
# `eqx.filter_*` see the arrays inside, as for a `dict`.
jtu.register_pytree_with_keys(WhereDict, _flatten_where_dict, _unflatten_where_dict)


def tree_at_all(
    tree: Any,
    where_dict: WhereDict | Mapping,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Replace every node a `WhereDict` names by its value, with `eqx.tree_at`.

    Replacements are made one at a time in insertion order, so an entry may
    select a node inside one replaced by an earlier entry, and a node and its
    own child may both be replaced (which one `eqx.tree_at` call cannot do).

    **Arguments:**

    - `tree`: the PyTree to modify (it is not changed in place).
    - `where_dict`: a `WhereDict`, or a mapping to build one from, whose values
      are the replacements.
    - `is_leaf`: passed to `eqx.tree_at`, e.g. `lambda x: x is None` to replace a
      `None`.

    **Returns:**

    A copy of `tree` with the replacements made.

    **Raises:**

    `ValueError` naming the label of an entry that selects no node of `tree`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxprob as ep

    linear = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    new = ep.tree_at_all(linear, {"bias": jnp.zeros(3), lambda m: m.weight: 1.0})
    assert new.weight == 1.0 and (new.bias == 0).all()
    ```
    """
    if not isinstance(where_dict, WhereDict):
        where_dict = WhereDict(where_dict)
    for label, (where, value) in zip(where_dict, where_dict.where_items()):
        _key_path(label, tree, is_leaf)  # a clear error naming the label
        tree = eqx.tree_at(where, tree, value, is_leaf=is_leaf)
    return tree
