"""Where-functions: labels, key paths, `WhereDict` and `tree_at_all`."""

import collections
import functools
import operator
import pickle
import re
import types

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eqxprob as ep


GetAttr, Seq, Dict = jtu.GetAttrKey, jtu.SequenceKey, jtu.DictKey
Pair = collections.namedtuple("Pair", "x y")


class Leaf(eqx.Module):
    w: jax.Array
    b: jax.Array
    name: str = eqx.field(static=True, default="leaf")

    @property
    def double(self):
        return 2 * self.w


class Mechanics(eqx.Module):
    effector: Leaf
    layers: list
    table: dict
    by_int: dict
    pair: Pair
    nothing: None = None


def _mechanics() -> Mechanics:
    leaf = lambda i: Leaf(jnp.full(2, float(i)), jnp.asarray(float(-i)))
    return Mechanics(
        effector=leaf(0),
        layers=[leaf(1), leaf(2), (jnp.ones(3), jnp.zeros(1))],
        table={"k": leaf(3), "it's": jnp.arange(2.0)},
        by_int={7: jnp.ones(()), 3: jnp.zeros(2)},
        pair=Pair(jnp.zeros(()), jnp.ones(())),
    )


class State(eqx.Module):
    mechanics: Mechanics
    scale: jax.Array


def _state() -> State:
    return State(_mechanics(), jnp.asarray(2.0))


# ------------------------------------------------------------------------ labels

LABELS = {
    "attr": (lambda s: s.mechanics, "mechanics"),
    "nested attr": (lambda s: s.mechanics.effector, "mechanics.effector"),
    "index": (lambda s: s.layers[0], "layers[0]"),
    "negative index": (lambda s: s.layers[-1], "layers[-1]"),
    "numpy index": (lambda s: s.layers[np.int64(3)], "layers[3]"),
    "key": (lambda s: s.c["k"], "c['k']"),
    "key with quote": (lambda s: s.c["it's"], 'c["it\'s"]'),
    "key with newline": (lambda s: s.c["a\nb"], "c['a\\nb']"),
    "attr after index": (lambda s: s.layers[2].w, "layers[2].w"),
    "index at root": (lambda s: s[0], "[0]"),
    "key at root": (lambda s: s["k"], "['k']"),
    "attr after key at root": (lambda s: s["k"].a, "['k'].a"),
    "unicode name": (lambda s: s.λ.café, "λ.café"),
    "identity": (lambda s: s, ""),
    "tuple": (lambda s: (s.a, s.b[0], s.c["k"]), ("a", "b[0]", "c['k']")),
    "list": (lambda s: [s.a, s.b], ["a", "b"]),
    "dict": (lambda s: {"x": s.a, "y": [s.b, (s.c,)]}, {"x": "a", "y": ["b", ("c",)]}),
    "namedtuple": (lambda s: Pair(s.a, s[1]), Pair("a", "[1]")),
    "nested tuples": (lambda s: ((s.a,), (s.b, (s.c.d,))), (("a",), ("b", ("c.d",)))),
    "none in output": (lambda s: (s.a, None), ("a", None)),
    "node and its child": (lambda s: (s.a, s.a.b), ("a", "a.b")),
    "same selection twice": (lambda s: (s.a, s.a), ("a", "a")),
    "generator": (lambda s: tuple(s.l[i] for i in range(3)), ("l[0]", "l[1]", "l[2]")),
    "attrgetter": (operator.attrgetter("a.b"), "a.b"),
    "itemgetter": (operator.itemgetter(2), "[2]"),
    "partial": (functools.partial(lambda s, i: s.l[i], i=4), "l[4]"),
}


@pytest.mark.parametrize("name", LABELS, ids=list(LABELS))
def test_labels(name):
    where, expected = LABELS[name]
    for _ in range(2):  # recorded afresh each time, to the same labels
        labels = ep.where_labels(where)
        assert labels == expected
        assert type(labels) is type(expected)


def test_label_of_a_string_is_itself():
    assert ep.where_labels("a.b") == "a.b"
    assert ep.where_labels("") == ""
    assert ep.where_labels("layers[-1].w['k']") == "layers[-1].w['k']"


@pytest.mark.parametrize(
    "label, match",
    [
        (".a", "write 'a'"),
        ('a["k"]', "write \"a['k']\""),
        ("a[01]", "write 'a[1]'"),
        ("a..b", "Cannot parse"),
        ("a[", "Cannot parse"),
        ("a b", "not a Python name"),
        ("1a", "not a Python name"),
        ("a[1.5]", "Cannot parse"),
    ],
)
def test_bad_labels_are_rejected(label, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ep.where_labels(label)


LABEL_ROUND_TRIP = ["", "a", "a.b", "[0]", "['k']", "a[-3].b['x y'][2]", "λ['\\n']"]


@pytest.mark.parametrize("label", LABEL_ROUND_TRIP)
def test_label_where_label_round_trip(label):
    (where,) = ep.WhereDict({label: None}).wheres()
    assert callable(where)
    assert ep.where_labels(where) == label


_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z").filter(
    lambda n: not n.startswith("__")
) | st.sampled_from(["λ", "café", "x\u0301", "class", "_x"])
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("."), _names),
        st.tuples(st.just("[]"), st.integers(-(10**20), 10**20)),
        st.tuples(st.just("[]"), st.text(max_size=6)),
    ),
    max_size=6,
)


def _apply(steps, tree):
    for kind, key in steps:
        tree = getattr(tree, key) if kind == "." else tree[key]
    return tree


@settings(max_examples=200, deadline=None)
@given(_steps)
def test_round_trip_property(steps):
    where = lambda s: _apply(steps, s)
    label = ep.where_labels(where)
    assert isinstance(label, str)
    assert ep.where_labels(label) == label
    (parsed,) = ep.WhereDict({label: 0}).wheres()
    assert ep.where_labels(parsed) == label
    # The label matches JAX's own spelling of the same path (dict keys for items).
    keys = [GetAttr(k) if kind == "." else Dict(k) for kind, k in steps]
    assert label == jtu.keystr(tuple(keys)).removeprefix(".")


# -------------------------------------------- labels follow what `where` reads


def test_loop_variable_closures_follow_python_semantics():
    late = [lambda m: m.layers[i] for i in range(3)]  # noqa: B023 (one cell)
    assert [ep.where_labels(f) for f in late] == ["layers[2]"] * 3
    bound = [lambda m, i=i: m.layers[i] for i in range(3)]
    assert [ep.where_labels(f) for f in bound] == [
        "layers[0]",
        "layers[1]",
        "layers[2]",
    ]
    made = [(lambda j: lambda m: m.layers[j])(i) for i in range(3)]
    assert [ep.where_labels(f) for f in made] == ["layers[0]", "layers[1]", "layers[2]"]


def test_rebinding_a_closure_variable_changes_the_label():
    i = 0
    where = lambda m: m.layers[i]
    assert ep.where_labels(where) == "layers[0]"
    for i in [1, 2, 1000, "k", 1000]:  # noqa: B007
        assert ep.where_labels(where) == f"layers[{i!r}]"


def test_equal_values_of_other_types_are_not_mixed_up():
    # 1 == True == 1.0, but only 1 is an index: each value is checked at its call.
    i = 1
    where = lambda m: m.layers[i]
    assert ep.where_labels(where) == "layers[1]"
    for i in [True, 1.0]:  # noqa: B007
        with pytest.raises(TypeError, match="use an int or a str"):
            ep.where_labels(where)
    i = 1
    assert ep.where_labels(where) == "layers[1]"


def test_defaults_and_keyword_only_defaults():
    where = lambda m, i=0: m.layers[i]
    assert ep.where_labels(where) == "layers[0]"
    where.__defaults__ = (5,)
    assert ep.where_labels(where) == "layers[5]"
    kw = lambda m, *, k="a": m.table[k]
    assert ep.where_labels(kw) == "table['a']"
    assert kw.__kwdefaults__ is not None
    kw.__kwdefaults__["k"] = "b"  # mutated in place
    assert ep.where_labels(kw) == "table['b']"


def test_reassigning_code_changes_the_label():
    where = lambda m: m.a
    assert ep.where_labels(where) == "a"
    assert ep.WhereDict({"a": 1, "b": 2})[where] == 1
    where.__code__ = (lambda m: m.b).__code__
    assert ep.WhereDict({"a": 1, "b": 2})[where] == 2
    assert ep.where_labels(where) == "b"


INDEX = 0


def test_rebinding_a_global_changes_the_label():
    global INDEX
    where = lambda m: m.layers[INDEX]
    try:
        assert ep.where_labels(where) == "layers[0]"
        INDEX = 3
        assert ep.where_labels(where) == "layers[3]"
    finally:
        INDEX = 0


def test_mutable_and_unhashable_closure_values_give_fresh_labels():
    idx = [0]
    by_list = lambda m: m.layers[idx[0]]
    config = types.SimpleNamespace(key="a")
    by_object = lambda m: m.table[config.key]
    names = {"which": "x"}
    by_dict = lambda m: getattr(m, names["which"])
    for n in range(3):
        idx[0] = n
        config.key = f"k{n}"
        names["which"] = f"f{n}"
        assert ep.where_labels(by_list) == f"layers[{n}]"
        assert ep.where_labels(by_object) == f"table['k{n}']"
        assert ep.where_labels(by_dict) == f"f{n}"


def test_mutating_returned_labels_does_not_change_later_labels():
    where = lambda s: [s.a, {"b": s.b}]
    labels = ep.where_labels(where)
    labels.append("junk")
    labels[1]["b"] = "junk"
    assert ep.where_labels(where) == ["a", {"b": "b"}]


def test_where_dict_lookup_follows_a_closure_variable():
    d = ep.WhereDict({"layers[0]": "first", "layers[1]": "second"})
    i = 0
    where = lambda m: m.layers[i]
    assert d[where] == "first" and where in d
    i = 1
    assert d[where] == "second" and d.get(where) == "second"
    i = 2
    assert where not in d and d.get(where) is None
    with pytest.raises(KeyError, match=re.escape("No entry for 'layers[2]'")):
        d[where]


def test_functions_from_one_code_with_different_defaults_differ():
    first, second = [lambda m, k=k: m.table[k] for k in ("a", "b")]
    assert first.__code__ is second.__code__
    assert ep.where_labels(first) == "table['a']"
    assert ep.where_labels(second) == "table['b']"
    d = ep.WhereDict({first: 1, second: 2})
    assert (d[first], d[second]) == (1, 2)


def test_emptied_closure_cell():
    def make():
        where = lambda m: m.layers[j]  # noqa: F821 (bound below)
        j = 1
        first = ep.where_labels(where)
        del j
        return where, first

    where, first = make()
    assert first == "layers[1]"
    with pytest.raises(NameError):
        ep.where_labels(where)


# ------------------------------------------------------------------- rejections

REJECTED = {
    "add": (lambda s: s.a + 1, "arithmetic on the selection 'a'"),
    "radd": (lambda s: 1 + s.a, "arithmetic"),
    "neg": (lambda s: -s.a, "arithmetic"),
    "matmul": (lambda s: s.a @ s.b, "arithmetic"),
    "call": (lambda s: s.a(), "a call on the selection 'a'"),
    "method call": (lambda s: s.a.sum(), "a call on the selection 'a.sum'"),
    "eq": (lambda s: s.a == 1, "a comparison"),
    "lt": (lambda s: s.a < 1, "a comparison"),
    "iteration": (lambda s: tuple(s.layers), "iteration"),
    "unpacking": (lambda s: [*s], "iteration or `in` on its argument"),
    "in": (lambda s: 1 in s.a, "iteration or `in`"),
    "len": (lambda s: s.layers[len(s.layers) - 1], "`len`"),
    "bool": (lambda s: s.a if s.flag else s.b, "truth testing"),
    "and": (lambda s: s.a and s.b, "truth testing"),
    "int": (lambda s: s.layers[int(s.i)], "conversion to a number"),
    "str": (lambda s: s.table[str(s.k)], "conversion to a string"),
    "f-string": (lambda s: s.table[f"{s.k}"], "conversion to a string"),
    "hash": (lambda s: {s.a: 1}, "hashing"),
    "float key": (lambda s: s.a[1.0], "the key 1.0"),
    "bool key": (lambda s: s.a[True], "the key True"),
    "slice": (lambda s: s.a[1:2], "the key slice"),
    "tuple key": (lambda s: s.a[0, 1], "the key (0, 1)"),
    "selection as key": (lambda s: s.a[s.i], "the key <selection 'i'>"),
    "dunder": (lambda s: s.a.__dict__, "the attribute '__dict__'"),
    "returns a constant": (lambda s: 3, "returned a int instead of a selection"),
    "returns a string": (lambda s: (s.a, "b"), "returned a str"),
    "jax": (lambda s: jnp.sum(s.a), ""),
}


@pytest.mark.parametrize("name", REJECTED, ids=list(REJECTED))
def test_computation_is_rejected(name):
    where, match = REJECTED[name]
    for _ in range(2):
        with pytest.raises(TypeError, match=re.escape(match) or None) as info:
            ep.where_labels(where)
        if name != "jax":  # jax reports the stand-in before calling it
            assert "may only select parts of its argument" in str(info.value)


@pytest.mark.parametrize("where", [3, None, ["a"]])
def test_non_function_where_is_rejected(where):
    with pytest.raises(TypeError, match="must be a function such as"):
        ep.where_labels(where)


# ------------------------------------------------------------------------ paths


def test_paths_of_every_leaf_match_jax():
    tree = _state()
    pairs = jtu.tree_flatten_with_path(tree)[0]
    assert len(pairs) > 10
    for path, leaf in pairs:
        label = jtu.keystr(path).removeprefix(".")
        assert ep.where_paths(label, tree) == path
        parsed = ep.WhereDict({label: 0}).wheres()[0]
        assert parsed(tree) is leaf


def test_paths_from_lambdas_nodes_and_leaves():
    tree = _state()
    paths = ep.where_paths(
        lambda s: {
            "node": s.mechanics.effector,
            "list": s.mechanics.layers[1].w,
            "negative": s.mechanics.layers[-1][0],
            "dict": s.mechanics.table["k"].b,
            "int key": s.mechanics.by_int[7],
            "namedtuple": (s.mechanics.pair.y, s.mechanics.pair[0]),
            "root": s,
            "none": s.mechanics.nothing,
        },
        tree,
    )
    m = GetAttr("mechanics")
    assert paths == {
        "node": (m, GetAttr("effector")),
        "list": (m, GetAttr("layers"), Seq(1), GetAttr("w")),
        "negative": (m, GetAttr("layers"), Seq(2), Seq(0)),
        "dict": (m, GetAttr("table"), Dict("k"), GetAttr("b")),
        "int key": (m, GetAttr("by_int"), Dict(7)),
        "namedtuple": (
            (m, GetAttr("pair"), GetAttr("y")),
            (m, GetAttr("pair"), GetAttr("x")),
        ),
        "root": (),
        "none": (m, GetAttr("nothing")),
    }
    leaf_paths = {path for path, _ in jtu.tree_flatten_with_path(tree)[0]}
    for key in ["list", "negative", "dict", "int key"]:
        assert paths[key] in leaf_paths
    assert all(p in leaf_paths for p in paths["namedtuple"])


def test_paths_of_a_node_and_its_own_child():
    tree = _state()
    outer, inner = ep.where_paths(
        lambda s: (s.mechanics.effector, s.mechanics.effector.w), tree
    )
    assert inner[: len(outer)] == outer
    assert inner == (GetAttr("mechanics"), GetAttr("effector"), GetAttr("w"))


def test_same_array_at_two_places_gets_the_path_named():
    x = jnp.arange(3.0)
    tree = {"a": x, "b": [x, x], "m": Leaf(x, x)}
    paths = ep.where_paths(lambda t: (t["b"][1], t["a"], t["m"].b, t["m"].w), tree)
    assert paths == (
        (Dict("b"), Seq(1)),
        (Dict("a"),),
        (Dict("m"), GetAttr("b")),
        (Dict("m"), GetAttr("w")),
    )
    jax_paths = {p for p, leaf in jtu.tree_flatten_with_path(tree)[0] if leaf is x}
    assert set(paths) < jax_paths


@pytest.mark.parametrize(
    "where, match",
    [
        (lambda s: s.mechanics.missing, "no pytree child 'missing'"),
        (lambda s: s.mechanics.effector.name, "no pytree child 'name'"),
        (lambda s: s.mechanics.effector.double, "no pytree child 'double'"),
        (lambda s: s.mechanics.layers[3], "no pytree child [3]"),
        (lambda s: s.mechanics.layers[-4], "no pytree child [-4]"),
        (lambda s: s.mechanics.table["nope"], "no pytree child ['nope']"),
        (lambda s: s.mechanics.by_int["7"], "no pytree child ['7']"),
        (lambda s: s.mechanics.layers["0"], "no pytree child ['0']"),
        (lambda s: s.scale[0], "'scale' is a leaf"),
        (lambda s: s.mechanics.nothing.x, "NoneType at 'mechanics.nothing' has no"),
    ],
)
def test_paths_of_missing_nodes_name_the_label(where, match):
    label = ep.where_labels(where)
    with pytest.raises(ValueError, match=re.escape(f"`where` selects {label!r}")):
        ep.where_paths(where, _state())
    with pytest.raises(ValueError, match=re.escape(match)):
        ep.where_paths(where, _state())


def test_paths_respect_is_leaf():
    tree = _state()
    where = lambda s: s.mechanics.effector.w
    assert len(ep.where_paths(where, tree)) == 3
    with pytest.raises(ValueError, match="is a leaf"):
        ep.where_paths(where, tree, is_leaf=lambda x: isinstance(x, Leaf))


# -------------------------------------------------------------------- WhereDict


def test_where_dict_lookup_by_lambda_or_label():
    a, b, c = object(), object(), object()
    d = ep.WhereDict({lambda x: x.foo.bar: a, "layers[0]": b, lambda x: x.t["k"]: c})
    assert d["foo.bar"] is d[lambda x: x.foo.bar] is a
    assert d[lambda x: x.layers[0]] is d["layers[0]"] is b
    assert d["t['k']"] is c
    assert (lambda x: x.foo.bar) in d and "layers[0]" in d
    assert (lambda x: x.foo) not in d and "foo" not in d
    assert list(d) == list(d.keys()) == ["foo.bar", "layers[0]", "t['k']"]
    assert len(d) == 3
    assert d.get(lambda x: x.nope, "default") == "default"
    assert d.get("foo.bar") is a
    assert d == {"foo.bar": a, "layers[0]": b, "t['k']": c}
    assert repr(ep.WhereDict({"a": 1})) == "WhereDict({'a': 1})"


def test_where_dict_keeps_where_functions():
    where = lambda x: x.foo.bar
    d = ep.WhereDict([(where, 1), ("layers[0]", 2)])
    wheres = d.wheres()
    assert wheres[0] is where
    assert ep.where_labels(wheres[1]) == "layers[0]"
    tree = _mechanics()
    assert wheres[1](tree) is tree.layers[0]
    assert [v for _, v in d.where_items()] == [1, 2]
    again = ep.WhereDict(d)
    assert again.wheres()[0] is where and again == d
    assert d.copy().wheres()[0] is where
    assert ep.WhereDict.fromkeys(["a", lambda s: s.b], 0) == {"a": 0, "b": 0}


def test_where_dict_pickles_with_label_keys():
    d = ep.WhereDict({"a.b": 1, "c[0]": 2})
    again = pickle.loads(pickle.dumps(d))
    assert type(again) is ep.WhereDict and again == d
    assert again[lambda s: s.c[0]] == 2


def test_where_dict_key_errors_name_the_label():
    d = ep.WhereDict({"a": 1, "b.c": 2})
    with pytest.raises(KeyError, match=re.escape("No entry for 'b.d'")) as info:
        d[lambda s: s.b.d]
    assert "'a', 'b.c'" in str(info.value)
    with pytest.raises(KeyError, match=re.escape("No entry for 'x[0]'")):
        d["x[0]"]


def test_where_dict_rejects_duplicates_and_bad_keys():
    with pytest.raises(ValueError, match=re.escape("Two WhereDict keys select 'a.b'")):
        ep.WhereDict({lambda s: s.a.b: 1, "a.b": 2})
    with pytest.raises(ValueError, match=re.escape("select 'l[0]'")):
        ep.WhereDict([(lambda s: s.l[0], 1), (lambda t: t.l[0], 2)])
    with pytest.raises(TypeError, match="must select a single node"):
        ep.WhereDict({lambda s: (s.a, s.b): (1, 2)})
    with pytest.raises(TypeError, match="must select a single node"):
        ep.WhereDict({"a": 1})[lambda s: (s.a, s.b)]
    with pytest.raises(ValueError, match="write 'a'"):
        ep.WhereDict({".a": 1})
    with pytest.raises(TypeError, match="may only select"):
        ep.WhereDict({lambda s: s.a + 1: 1})
    with pytest.raises(TypeError, match=r"\(key, value\) pairs"):
        ep.WhereDict(["a"])
    with pytest.raises(TypeError, match="must be a function"):
        ep.WhereDict({3: 1})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("a", 2),
        lambda d: d.__delitem__("a"),
        lambda d: d.update(b=1),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("b", 1),
        lambda d: d.clear(),
        lambda d: d.__ior__({"b": 1}),
    ],
)
def test_where_dict_is_immutable(mutate):
    d = ep.WhereDict({"a": 1})
    with pytest.raises(TypeError, match="immutable"):
        mutate(d)
    assert d == {"a": 1}


# ------------------------------------------------------------------ tree_at_all


def test_tree_at_all_matches_manual_tree_at():
    tree = _state()
    w = jnp.full(2, 9.0)
    where_dict = ep.WhereDict(
        {
            lambda s: s.mechanics.effector.w: w,
            "mechanics.layers[1].b": jnp.asarray(5.0),
            lambda s: s.mechanics.table["k"]: None,
            "scale": jnp.asarray(3.0),
        }
    )
    expected = eqx.tree_at(lambda s: s.mechanics.effector.w, tree, w)
    expected = eqx.tree_at(
        lambda s: s.mechanics.layers[1].b, expected, jnp.asarray(5.0)
    )
    expected = eqx.tree_at(lambda s: s.mechanics.table["k"], expected, None)
    expected = eqx.tree_at(lambda s: s.scale, expected, jnp.asarray(3.0))
    result = ep.tree_at_all(tree, where_dict)
    assert eqx.tree_equal(result, expected)
    assert not eqx.tree_equal(result, tree)
    assert result.mechanics.effector.w is w
    # A plain mapping works too.
    assert eqx.tree_equal(ep.tree_at_all(tree, dict(where_dict)), expected)


def test_tree_at_all_replaces_a_node_and_then_its_child():
    tree = _state()
    new = Leaf(jnp.zeros(2), jnp.zeros(()))
    result = ep.tree_at_all(
        tree,
        {lambda s: s.mechanics.effector: new, "mechanics.effector.b": jnp.ones(())},
    )
    assert result.mechanics.effector.w is new.w
    assert result.mechanics.effector.b == 1.0
    assert result.mechanics.layers[0].w is tree.mechanics.layers[0].w


def test_identity_selects_the_whole_tree():
    tree = _state()
    assert ep.where_labels(lambda s: s) == ""
    assert ep.where_paths(lambda s: s, tree) == ()
    assert ep.WhereDict({"": 1})[lambda s: s] == 1
    assert ep.tree_at_all(tree, {lambda s: s: "replaced"}) == "replaced"


def test_tree_at_all_names_a_missing_label():
    with pytest.raises(ValueError, match=re.escape("`where` selects 'mechanics.nope'")):
        ep.tree_at_all(_state(), {"mechanics.nope": 1})


# ------------------------------------------------------------ selecting nothing


def test_a_where_that_selects_nothing_is_a_type_error():
    for where in (lambda m: None, lambda m: (), lambda m: [], lambda m: {}):
        with pytest.raises(TypeError, match="selects nothing"):
            ep.where_labels(where)


def test_where_dict_is_a_pytree_over_its_values():
    d = ep.WhereDict({lambda m: m.a: jnp.array(1.0), "b": jnp.array(2.0)})
    assert jax.tree_util.tree_leaves(d) == [d["a"], d["b"]]
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(d)[0]]
    assert paths == [(jax.tree_util.DictKey("a"),), (jax.tree_util.DictKey("b"),)]
    assert jax.jit(lambda d: d["a"] * 2)(d) == 2.0
    grads = jax.grad(lambda d: d["a"] * d["b"])(d)
    assert isinstance(grads, ep.WhereDict) and (grads["a"], grads["b"]) == (2.0, 1.0)
    assert eqx.filter_jit(lambda d: d[lambda m: m.b] + 1)(d) == 3.0
    doubled = jax.tree_util.tree_map(lambda x: 2 * x, d)
    assert isinstance(doubled, ep.WhereDict) and doubled["b"] == 4.0


def test_where_dict_or_and_get_behave_like_dict():
    d = ep.WhereDict({lambda m: m.a: 1, "b": 2})
    e = d | {"c": 3, lambda m: m.a: 5}
    assert isinstance(e, ep.WhereDict)
    assert dict(e) == {"a": 5, "b": 2, "c": 3} and list(e) == ["a", "b", "c"]
    assert dict(e) == {**dict(d), "c": 3, "a": 5}
    assert isinstance({"z": 0} | d, ep.WhereDict)
    assert d.get(3, "default") == "default"
    assert d.get(lambda m: m + 1, "default") == "default"
    assert d.get("missing") is None and d.get(lambda m: m.b) == 2
