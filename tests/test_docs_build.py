"""The documentation site builds with `mkdocs build --strict`; the built pages say
what the library is for, open API entries with one signature and cut no output;
and the API reference covers the whole public API."""

import html as htmllib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

import eqxprob as ep


ROOT = pathlib.Path(__file__).resolve().parent.parent
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
DIRECTIVE = re.compile(r"^:::\s+eqxprob\.(\w+)\s*$", re.MULTILINE)


# The site is built once, by the `site` fixture, and every test that reads it runs
# on one xdist worker (`--dist=loadgroup`), so `make test` builds it once.
SITE = pytest.mark.xdist_group("docs_site")
# A block that does not wrap must fit 88 columns (ruff's line length), which
# docs/css/extra.css's code font fits in the content column of a 1280 px window.
COLUMNS = 88


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' to build docs")
    site_dir = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's banner
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"]
        + ["--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert result.returncode == 0, output
    assert not warnings, "\n".join(warnings)
    return site_dir


def _article(html: str) -> str:
    """The page's content, without the navigation, header and footer."""
    start = html.index('<article class="md-content__inner')
    return html[start : html.index("</article>", start)]


def _text(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


@SITE
def test_mkdocs_build_is_clean(site):
    assert (site / "index.html").exists()
    # Pages with `execute: true` show what their code printed and drew.
    for page in ("constrained", "variational", "from_gpjax"):
        html = (site / "howto" / page / "index.html").read_text()
        assert "data:image/png;base64," in html, page
    html = (site / "howto" / "from_gpjax" / "index.html").read_text()
    assert "prior.kernel.lengthscale" in html.split("ep.summary(trained)")[-1]


@SITE
def test_landing_page_says_what_it_is_for_and_shows_a_figure(site):
    article = _article((site / "index.html").read_text())
    # Before the first section: what it is for, and the figure.
    top = article.split("<h2", 1)[0]
    text = _text(top).lower()
    assert "gaussian process" in text and "variational inference" in text
    figure = re.search(r'<img\b[^>]*\bsrc="([^"]+)"', top)
    assert figure is not None, "no figure before the first section"
    assert (site / figure.group(1)).is_file(), figure.group(1)
    # The shortest model runs when the page is built: its table is on the page.
    model = article.split("A Gaussian process in", 1)[1]
    assert re.search(r'class="language-text[^"]*".*?lengthscale', model, re.S)


@SITE
def test_fit_page_opens_with_one_signature_and_the_summary(site):
    article = _article((site / "api" / "fit" / "index.html").read_text())
    start = article.index('id="eqxprob.fit"')
    fit = article[start : article.index('id="eqxprob.FitState"', start)]
    assert fit.count("doc-signature") == 1
    assert "overload" not in fit
    # After the signature: the one-line summary, then the arguments.
    after = fit.split("</pre></div>", 1)[1]
    opening = after[: after.index("Arguments:")]
    assert "<p>" in opening and "<pre" not in opening, opening


_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")
_CODE_BLOCK = re.compile(
    r'<div class="([^"]*\bhighlight\b[^"]*)"[^>]*>\s*<pre\b[^>]*>(.*?)</pre>', re.S
)


def _wrapped_classes(css: str) -> set[str]:
    """The block classes whose `pre > code` the CSS makes wrap (`pre-wrap`)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    wrapped = set()
    for selectors, body in _RULE.findall(css):
        if not re.search(r"white-space\s*:\s*pre-wrap", body):
            continue
        for selector in selectors.split(","):
            match = re.fullmatch(r"\s*\.md-typeset \.([\w-]+) pre > code\s*", selector)
            if match:
                wrapped.add(match.group(1))
    return wrapped


@SITE
def test_no_printed_output_or_code_is_cut(site):
    """Every code or output block of every page either wraps (the CSS the pages
    link gives its class `white-space: pre-wrap`) or fits 88 columns, so nothing
    hides behind a horizontal scrollbar: printed tables, error messages, arrays."""
    wrapped = _wrapped_classes((site / "css" / "extra.css").read_text())
    assert wrapped == {"language-text"}  # what executed pages and examples print
    cut, printed = [], 0
    for page in sorted(site.rglob("index.html")):
        html = page.read_text()
        assert re.search(r'<link\b[^>]*href="[^"]*css/extra\.css"', html), page
        for classes, body in _CODE_BLOCK.findall(_article(html)):
            lines = htmllib.unescape(re.sub(r"<[^>]+>", "", body)).splitlines()
            if wrapped & set(classes.split()):
                printed += 1
                continue
            for line in lines:
                if len(line) > COLUMNS:
                    name = page.parent.relative_to(site)
                    cut.append(f"{name}: {len(line)} columns [{classes}]: {line}")
    assert printed > 10  # the output blocks are there, and marked as text
    assert not cut, "\n".join(cut)


def test_every_public_name_is_in_the_api_reference():
    documented = {
        name for page in API_PAGES for name in DIRECTIVE.findall(page.read_text())
    }
    public = set(ep.__all__) - {"__version__"}
    missing = sorted(public - documented)
    assert not missing, (
        f"not in any docs/api/*.md page as `::: eqxprob.<name>`: {missing}"
    )
    unknown = sorted(documented - public)
    assert not unknown, f"documented in docs/api/ but not in eqxprob.__all__: {unknown}"


def test_ep_mentions_become_cross_links_outside_code_blocks():
    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    documented = {"fit", "Bijector"}
    html = (
        "<p>Train with <code>ep.fit</code>, build <code>ep.Bijector.from_value</code>"
        ", not <code>ep.nothing</code>.</p>"
        "<pre><code>ep.fit  # <code>ep.fit</code> in code stays</code></pre>"
        '<p>Linked: <a href="x"><code>ep.fit</code></a>.</p>'
    )
    out = hooks.link(html, documented)
    fit = '<autoref identifier="eqxprob.fit"><code>ep.fit</code></autoref>'
    assert f"Train with {fit}, build" in out
    assert '<autoref identifier="eqxprob.Bijector"><code>ep.Bijector.' in out
    assert "<code>ep.nothing</code>" in out and "eqxprob.nothing" not in out
    assert "<pre><code>ep.fit  # <code>ep.fit</code> in code stays</code></pre>" in out
    assert out.count("<autoref") == 2  # nothing inside links or code blocks
