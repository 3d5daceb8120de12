"""Every fenced `python` block in the README and docs runs, so the docs cannot rot.

Blocks of one file run in order in one namespace, like a notebook.
"""

import pathlib
import re

import pytest


ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_python_blocks_run(path, monkeypatch, tmp_path):
    blocks = BLOCK.findall(path.read_text())
    if not blocks:
        pytest.skip("no python blocks")
    monkeypatch.chdir(tmp_path)  # anything a block writes lands in a temp dir
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
