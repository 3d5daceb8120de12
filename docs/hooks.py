"""mkdocs hooks.

- Every `ep.name` in inline code becomes a cross-link to its API entry, in the pages
  and in the docstrings they render alike.
- A page whose front matter says `execute: true` runs its `python` blocks at build
  time, in order, in one namespace (as tests/test_docs.py does), and shows under each
  block what it printed and the matplotlib figures it drew: the build fails if the
  code fails, so what the page shows is what its code does.
- A line `<!-- source: examples/x.py Name other -->` becomes a `python` block of
  those top-level definitions, read from the file at build time (so the page shows
  the code that runs, never a copy); a missing name fails the build.

It runs on each page's HTML (`on_page_content`, before mkdocs-autorefs resolves
references) and wraps `<code>ep.name</code>` in an autorefs reference to
`eqxprob.name`, except inside links and code blocks. Only names documented with a
`::: eqxprob.<name>` directive in `docs/api/` are linked (a dotted mention such as
`ep.Bijector.from_value` links to `eqxprob.Bijector`), so a strict build never meets
a reference it cannot resolve.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import pathlib
import re
import tempfile


_API = pathlib.Path(__file__).parent / "api"
_DIRECTIVE = re.compile(r"^:::\s+eqxprob\.([\w.]+)\s*$", re.MULTILINE)
# Links and preformatted blocks are left alone; everything between them is prose.
_SKIP = re.compile(r"(<a\b.*?</a>|<pre\b.*?</pre>|<autoref\b.*?</autoref>)", re.DOTALL)
_MENTION = re.compile(r"<code>ep\.([A-Za-z_]\w*)((?:\.\w+)*)</code>")


def _documented() -> set[str]:
    names = set()
    for page in _API.glob("*.md"):
        names.update(_DIRECTIVE.findall(page.read_text()))
    return names


def link(html: str, documented: set[str]) -> str:
    """`html` with documented `ep.*` mentions wrapped in autorefs references."""

    def replace(match: re.Match) -> str:
        name, rest = match.group(1), match.group(2)
        target = name + rest if name + rest in documented else name
        if target not in documented:
            return match.group(0)
        return f'<autoref identifier="eqxprob.{target}">{match.group(0)}</autoref>'

    parts = _SKIP.split(html)
    return "".join(
        part if _SKIP.fullmatch(part) else _MENTION.sub(replace, part) for part in parts
    )


def on_page_content(html: str, page, config, files) -> str:
    return link(html, _documented())


_BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


def execute(markdown: str, name: str) -> str:
    """`markdown` with the output and figures of each `python` block after it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace: dict = {"__name__": "__docs__"}
    parts, done = [], 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        for i, match in enumerate(_BLOCK.finditer(markdown)):
            parts.append(markdown[done : match.end()])
            done = match.end()
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                # dont_inherit: the page's code runs without this file's `annotations`
                # future (as in tests/test_docs.py), so `x: int` is not a string
                code = compile(
                    match.group(1), f"{name}[block {i}]", "exec", dont_inherit=True
                )
                exec(code, namespace)
            if printed.getvalue():
                parts.append(f"\n```text\n{printed.getvalue().rstrip()}\n```\n")
            for number in plt.get_fignums():
                png = io.BytesIO()
                plt.figure(number).savefig(png, format="png", dpi=90)
                data = base64.b64encode(png.getvalue()).decode()
                image = f"data:image/png;base64,{data}"
                parts.append(f"\n![Figure drawn by the code above]({image})\n")
            plt.close("all")
    return "".join(parts) + markdown[done:]


_SOURCE = re.compile(r"^<!-- source: (\S+) ([\w ]+) -->$", re.MULTILINE)
_ROOT = pathlib.Path(__file__).parent.parent


def source(markdown: str) -> str:
    """`markdown` with each `<!-- source: path names -->` line replaced by the
    named top-level definitions of `path` (relative to the repository)."""

    def replace(match: re.Match) -> str:
        text = (_ROOT / match.group(1)).read_text()
        defined = {getattr(node, "name", None): node for node in ast.parse(text).body}
        lines = text.splitlines()
        blocks = []
        for name in match.group(2).split():
            if name not in defined:
                raise KeyError(f"{match.group(1)} defines no top-level {name!r}")
            node = defined[name]
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            blocks.append("\n".join(lines[first - 1 : node.end_lineno]))
        return "```python\n" + "\n\n\n".join(blocks) + "\n```"

    return _SOURCE.sub(replace, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    markdown = source(markdown)
    if not page.meta.get("execute"):
        return markdown
    return execute(markdown, page.file.src_path)
