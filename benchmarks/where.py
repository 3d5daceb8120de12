"""Where-function labels and `WhereDict` against the known approaches.

Run: `python benchmarks/where.py` (`--quick`: 3 rounds). Prints median times
with ratios against a baseline measured in the same run; asserts nothing about
time.

Baselines implemented here:

- `dis`: read the where-function's bytecode (attribute access only), recomputed at
  every build and access, as in the published implementation;
- tree ids: replace the selected nodes of an example tree by markers with
  `eqx.tree_at(..., replace_fn=...)`, then find the markers' key paths by identity.
  Needs a tree; fails when a node and its own child are both selected.
"""

import argparse
import collections
import dis
import statistics
import sys
import timeit

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu

import eqxprob as ep


# ---------------------------------------------------------------- baselines


def dis_labels(where):
    """Labels from bytecode: chains of LOAD_ATTR after loading the argument."""
    argument = where.__code__.co_varnames[0]
    chains = []
    for instruction in dis.get_instructions(where):
        if instruction.opname == "LOAD_FAST" and instruction.argval == argument:
            chains.append([])
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and chains:
            chains[-1].append(instruction.argval)
    labels = tuple(".".join(chain) for chain in chains)
    return labels[0] if len(labels) == 1 else labels


class DisDict(collections.OrderedDict):
    def __init__(self, entries):
        super().__init__(
            (k if isinstance(k, str) else dis_labels(k), v) for k, v in entries.items()
        )

    def __getitem__(self, key):
        return super().__getitem__(key if isinstance(key, str) else dis_labels(key))


class _Mark:
    __slots__ = ()


def _is_mark(x):
    return isinstance(x, _Mark)


def tree_id_labels(where, tree):
    """Labels by marking the selected nodes of `tree` and matching ids."""
    marked = eqx.tree_at(where, tree, replace_fn=lambda _: _Mark())
    pairs = jtu.tree_flatten_with_path(marked, is_leaf=_is_mark)[0]
    paths = {id(x): jtu.keystr(p).removeprefix(".") for p, x in pairs if _is_mark(x)}
    return jtu.tree_map(lambda m: paths[id(m)], where(marked), is_leaf=_is_mark)


class TreeIdDict(collections.OrderedDict):
    def __init__(self, entries, tree):
        self.tree = tree
        super().__init__(
            (k if isinstance(k, str) else tree_id_labels(k, tree), v)
            for k, v in entries.items()
        )

    def __getitem__(self, key):
        label = key if isinstance(key, str) else tree_id_labels(key, self.tree)
        return super().__getitem__(label)


# ------------------------------------------------------------------- a model


class Linear(eqx.Module):
    weight: jnp.ndarray
    bias: jnp.ndarray


class Mechanics(eqx.Module):
    effector: jnp.ndarray
    skeleton: Linear


class Network(eqx.Module):
    hidden: Linear
    readout: Linear


class Model(eqx.Module):
    mechanics: Mechanics
    network: Network
    noise: jnp.ndarray


def _linear(n):
    return Linear(jnp.ones((n, n)), jnp.zeros(n))


TREE = Model(
    Mechanics(jnp.zeros(2), _linear(2)), Network(_linear(3), _linear(4)), jnp.ones(())
)
WHERES = [
    lambda s: s.mechanics.effector,
    lambda s: s.mechanics.skeleton.weight,
    lambda s: s.network.hidden,
    lambda s: s.network.readout.bias,
    lambda s: s.noise,
]
LABELS = [
    "mechanics.effector",
    "mechanics.skeleton.weight",
    "network.hidden",
    "network.readout.bias",
    "noise",
]
SEEN = WHERES[0]


def _closure(field):
    return lambda s: getattr(s.network, field).bias


CLOSURE = _closure("readout")


# ----------------------------------------------------------------- timing

ENTRIES = "entries = dict(zip(WHERES, range(5)))"


def measure(rows, repeat=31, run_seconds=0.002):
    """Median ns per call of each `(name, stmt, setup)`, timed in interleaved rounds.

    Interleaving exposes every row to the same background load, which keeps the
    ratios meaningful on a busy machine.
    """
    timers = {
        name: timeit.Timer(stmt, setup=setup, globals=dict(globals()))
        for name, stmt, setup in rows
    }
    numbers = {}
    for name, timer in timers.items():
        one = min(timer.repeat(repeat=3, number=1))
        numbers[name] = max(1, int(run_seconds / max(one, 1e-7)))
    runs = {name: [] for name in timers}
    for _ in range(repeat):
        for name, timer in timers.items():
            runs[name].append(timer.timeit(numbers[name]) / numbers[name] * 1e9)
    return {name: statistics.median(times) for name, times in runs.items()}


SECTIONS = {
    "label of one where-function": [
        ("eqxprob where_labels", "ep.where_labels(SEEN)", "pass"),
        (
            "eqxprob where_labels, new lambda",
            "ep.where_labels(lambda s: s.mechanics.effector)",
            "pass",
        ),
        ("eqxprob where_labels, closure", "ep.where_labels(CLOSURE)", "pass"),
        ("dis bytecode", "dis_labels(SEEN)", "pass"),
        ("tree ids + eqx.tree_at", "tree_id_labels(SEEN, TREE)", "pass"),
    ],
    "build with 5 entries": [
        (
            "OrderedDict of labels",
            "collections.OrderedDict(pairs)",
            "pairs = list(zip(LABELS, range(5)))",
        ),
        ("WhereDict from where-functions", "ep.WhereDict(entries)", ENTRIES),
        (
            "WhereDict from labels",
            "ep.WhereDict(entries)",
            "entries = dict(zip(LABELS, range(5)))",
        ),
        ("dis dict", "DisDict(entries)", ENTRIES),
        ("tree-id dict", "TreeIdDict(entries, TREE)", ENTRIES),
    ],
    "access one entry": [
        (
            "OrderedDict[label]",
            "d[key]",
            "d = collections.OrderedDict(zip(LABELS, range(5))); key = LABELS[0]",
        ),
        (
            "WhereDict[label]",
            "d[key]",
            f"{ENTRIES}; d = ep.WhereDict(entries); key = LABELS[0]",
        ),
        ("WhereDict[lambda]", "d[SEEN]", f"{ENTRIES}; d = ep.WhereDict(entries)"),
        ("dis dict[lambda]", "d[SEEN]", f"{ENTRIES}; d = DisDict(entries)"),
        (
            "tree-id dict[lambda]",
            "d[SEEN]",
            f"{ENTRIES}; d = TreeIdDict(entries, TREE)",
        ),
    ],
}


def main():
    parser = argparse.ArgumentParser(description="Where-function label timings.")
    parser.add_argument("--quick", action="store_true", help="3 rounds, not 31")
    args = parser.parse_args()
    # The approaches agree (all entries are attribute-only, which `dis` needs).
    assert [ep.where_labels(w) for w in WHERES] == LABELS
    assert [dis_labels(w) for w in WHERES] == LABELS
    assert [tree_id_labels(w, TREE) for w in WHERES] == LABELS
    entries = dict(zip(WHERES, range(5)))
    for d in [ep.WhereDict(entries), DisDict(entries), TreeIdDict(entries, TREE)]:
        assert d[SEEN] == d[LABELS[0]] == 0

    width = 46
    print(f"Python {sys.version.split()[0]}, median per call; ratio to the first row")
    print(f"{'':{width}} {'median':>10} {'ratio':>9}")
    for title, rows in SECTIONS.items():
        print(f"-- {title} " + "-" * (width + 16 - len(title)))
        times = measure(rows, repeat=3 if args.quick else 31)
        base = times[rows[0][0]]
        for name, ns in times.items():
            time = f"{ns / 1000:.2f} µs" if ns >= 1000 else f"{ns:.0f} ns"
            print(f"{name:{width}} {time:>10} {ns / base:>8.1f}x")


if __name__ == "__main__":
    main()
