"""Every link in the README and docs/ leads somewhere, both on GitHub (relative to the
repository, anchors as GitHub makes them) and in the MkDocs site (`mkdocs build --strict`,
whose link and anchor checks are errors: mkdocs.yml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelpool.config import load_config
from tests.docs.markdown_links import anchors, broken_links, github_slug, links

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_on_github(page: Path) -> None:
    assert broken_links(page, ROOT) == []


def test_the_readme_fits_the_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = {target.partition("#")[0] for target in links(readme)}
    for page in ("docs/index.md", "docs/configuration.md", "docs/security.md", "docs/cli.md", "docs/endpoints.md"):
        assert page in targets


def test_the_link_checker_catches_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Title: the `one` (and only)\n\n## Title: the `one` (and only)\n\n"
        "[ok](#title-the-one-and-only-1) [bad](#nope) [gone](missing.md) [out](../x.md)\n\n"
        "```\n[in code](nowhere.md)\n```\n`[inline](nowhere.md)` [web](https://example.com/x)\n"
    )
    assert github_slug("Browsers on the same machine (DNS rebinding, cross-site posts)") == (
        "browsers-on-the-same-machine-dns-rebinding-cross-site-posts"
    )
    assert anchors((tmp_path / "a.md").read_text()) == {"title-the-one-and-only", "title-the-one-and-only-1"}
    problems = broken_links(tmp_path / "a.md", tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "#nope (no such heading)",
        "missing.md (no such file)",
        "../x.md (no such file)",
    ]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """MkDocs checks the docs' links and anchors with its own slugs; any warning fails."""
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_the_config_basics_example_is_a_valid_config(page: str, tmp_path: Path) -> None:
    """The first YAML block of these pages is a whole config file: it loads as one."""
    text = (ROOT / page).read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "modelpool.yaml").write_text(block)
    config = load_config(tmp_path / "modelpool.yaml", environ={})
    assert config.pool.memory_budget_bytes == 8 * 1024**3
    assert config.models["smollm2-135m-instruct"].options["n_ctx"] == 2048
    assert config.models["qwen2.5-0.5b-instruct"].keep_alive == 600
