"""Every fenced `python` block in the README and docs runs, so the docs cannot rot.

Blocks of one file run in order in one namespace, like a notebook.
"""

import importlib.util
import inspect
import pathlib
import re

import jax
import pytest

import eqxprob as ep


ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


# Pages whose front matter says `execute: true` run their blocks when the site is
# built (tests/test_docs_build.py, the same blocks in one namespace, in order):
# here only where that build cannot run.
EXECUTED_BY_THE_BUILD = (
    {p for p in FILES if re.match(r"---\n(.*\n)*?execute: true\b", p.read_text())}
    if importlib.util.find_spec("mkdocs") is not None
    else set()
)
FILES_WITH_CODE = [
    p for p in FILES if BLOCK.search(p.read_text()) and p not in EXECUTED_BY_THE_BUILD
]


@pytest.mark.parametrize(
    "path", FILES_WITH_CODE, ids=[str(p.relative_to(ROOT)) for p in FILES_WITH_CODE]
)
def test_python_blocks_run(path, monkeypatch, tmp_path):
    blocks = BLOCK.findall(path.read_text())
    monkeypatch.chdir(tmp_path)  # anything a block writes lands in a temp dir
    namespace: dict = {"__name__": "__docs__"}
    name = str(path.relative_to(ROOT))
    promotion = "standard" if name in RAW_OPTAX_LOOPS else "strict"
    with jax.numpy_dtype_promotion(promotion):
        for i, code in enumerate(blocks):
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)


# Pages with a hand-written optax loop, which runs optax's own code under the
# user's promotion (ep.fit does not): optax/tree_utils/_tree_math.py:449 mixes
# its int32 step count with a float, so these run under standard promotion.
RAW_OPTAX_LOOPS = {"README.md", "docs/howto/freezing.md", "docs/howto/multi_device.md"}


def _public_objects():
    """Every public name, and the public methods and properties of public classes."""
    for name in sorted(set(ep.__all__) - {"__version__"}):
        obj = getattr(ep, name)
        yield name, obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (member.__doc__ or "").strip():
                    yield f"{name}.{attr}", member


PUBLIC = dict(_public_objects())


@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if "." not in n))
def test_every_public_name_has_a_docstring_with_an_example(name):
    doc = inspect.getdoc(PUBLIC[name]) or ""
    assert len(doc.splitlines()) >= 3, f"{name} needs a docstring"
    assert "```python" in doc, f"{name}'s docstring needs a runnable example"


def _examples(name: str) -> list[str]:
    return BLOCK.findall((inspect.getdoc(PUBLIC[name]) or "") + "\n")


# Every docstring example runs here, and only here.
@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if _examples(n)))
def test_docstring_examples_run(name, monkeypatch, tmp_path):
    blocks = _examples(name)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{name}.__doc__[block {i}]", "exec"), namespace)
