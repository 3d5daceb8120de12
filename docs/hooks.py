"""mkdocs hook: every `ep.name` mentioned in inline code becomes a cross-link to
its API entry (autorefs), outside fenced code blocks.

Only names documented with a `::: eqxprob.<name>` directive in `docs/api/` are
linked (a dotted mention such as `ep.Bijector.from_value` links to `eqxprob.Bijector`),
so a strict build never meets a reference it cannot resolve.
"""

from __future__ import annotations

import pathlib
import re


_API = pathlib.Path(__file__).parent / "api"
_DIRECTIVE = re.compile(r"^:::\s+eqxprob\.([\w.]+)\s*$", re.MULTILINE)
_FENCE = re.compile(r"(^```.*?^```)", re.DOTALL | re.MULTILINE)
# `ep.name` or `ep.name.more`, not already inside a link's text: [`ep.x`][...]
_MENTION = re.compile(r"(?<!\[)`ep\.([A-Za-z_]\w*)((?:\.\w+)*)`(?!\]\[)")


def _documented() -> set[str]:
    names = set()
    for page in _API.glob("*.md"):
        names.update(_DIRECTIVE.findall(page.read_text()))
    return names


def link(markdown: str, documented: set[str]) -> str:
    """`markdown` with documented `ep.*` mentions linked, code blocks untouched."""

    def replace(match: re.Match) -> str:
        name, rest = match.group(1), match.group(2)
        dotted = name + rest
        if dotted in documented:
            target = dotted
        elif name in documented:
            target = name
        else:
            return match.group(0)
        return f"[`ep.{dotted}`][eqxprob.{target}]"

    parts = _FENCE.split(markdown)
    return "".join(
        part if part.startswith("```") else _MENTION.sub(replace, part)
        for part in parts
    )


def on_page_markdown(markdown: str, page, config, files) -> str:
    return link(markdown, _documented())
