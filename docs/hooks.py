"""mkdocs hook: every `ep.name` in inline code becomes a cross-link to its API entry,
in the pages and in the docstrings they render alike.

It runs on each page's HTML (`on_page_content`, before mkdocs-autorefs resolves
references) and wraps `<code>ep.name</code>` in an autorefs reference to
`eqxprob.name`, except inside links and code blocks. Only names documented with a
`::: eqxprob.<name>` directive in `docs/api/` are linked (a dotted mention such as
`ep.Bijector.from_value` links to `eqxprob.Bijector`), so a strict build never meets
a reference it cannot resolve.
"""

from __future__ import annotations

import pathlib
import re


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
