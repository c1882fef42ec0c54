"""Every link in the README and docs/ leads somewhere, both on GitHub (relative to the
repository, anchors as GitHub makes them) and in the MkDocs site (`mkdocs build --strict`,
whose link and anchor checks are errors: mkdocs.yml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
