"""The documentation site builds with `mkdocs build --strict`, and the API reference
covers the whole public API."""

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


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed: pip install -e '.[docs]' to build the docs",
)
def test_mkdocs_build_is_clean(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's banner
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"]
        + ["--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert result.returncode == 0, output
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "index.html").exists()
    # Pages with `execute: true` show what their code printed and drew.
    for page in ("constrained", "variational", "from_gpjax"):
        html = (tmp_path / "howto" / page / "index.html").read_text()
        assert "data:image/png;base64," in html, page
    html = (tmp_path / "howto" / "from_gpjax" / "index.html").read_text()
    assert "prior.kernel.lengthscale" in html.split("ep.summary(trained)")[-1]


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
