"""The links of a Markdown file and the anchors its headings make, as GitHub renders them
(the README is read there, outside the MkDocs site, so MkDocs cannot check its links)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link inside code is only text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def links(text: str) -> list[str]:
    found: list[str] = []
    for line in prose_lines(text):
        without_code = re.sub(r"`[^`]*`", "", line)
        found += LINK.findall(without_code)
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without Markdown, lower case, punctuation
    dropped (letters, digits, `-` and `_` kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets GitHub's `-1`, `-2` suffixes."""
    seen: Counter[str] = Counter()
    result: set[str] = set()
    for line in prose_lines(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = github_slug(match.group(1))
            result.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return result


def broken_links(page: Path, root: Path) -> list[str]:
    """The links of `page` that lead nowhere: a missing file, a path out of the repository,
    or an anchor no heading of the target makes. Web addresses are not fetched."""
    problems = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page.resolve()
        if not resolved.is_relative_to(root) or not resolved.exists():
            problems.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return problems
