"""The Hugging Face cache, as modelpool's `cache ls|rm` shows it: one entry per repo, with
its size on disk (blobs counted once) and revisions.

Removal goes through the repo's own folder inside the cache root and nowhere else: a name
that does not resolve to `<cache>/models--org--name` is refused."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.listing import repo_folder
from modelpool.hub.reference import parse_reference


@dataclass(frozen=True)
class CacheEntry:
    repo_id: str
    path: Path
    size_bytes: int
    revisions: tuple[str, ...]
    """Commit shas cached, newest first when known."""
    refs: tuple[str, ...]


def cache_entries(access: HubAccess) -> list[CacheEntry]:
    """Every model repo in the cache (an absent cache is empty)."""
    root = access.cache_root
    if not root.is_dir():
        return []
    entries = []
    for folder in sorted(root.glob("models--*--*")):
        if folder.is_dir() and not folder.is_symlink():
            entries.append(_entry(folder))
    return entries


def remove_entry(access: HubAccess, repo_id: str) -> CacheEntry:
    """Delete a repo's whole cache folder; returns what was removed."""
    parse_reference(repo_id)  # an org/name and nothing else: no path tricks
    folder = repo_folder(access, repo_id)
    root = access.cache_root.resolve()
    if folder.is_symlink() or not folder.is_dir() or folder.resolve().parent != root:
        raise ModelSourceError(f"{repo_id} is not in the Hugging Face cache ({root})")
    entry = _entry(folder)
    shutil.rmtree(folder)
    return entry


def _entry(folder: Path) -> CacheEntry:
    _, org, name = folder.name.split("--", 2)
    snapshots = folder / "snapshots"
    revisions = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True) \
        if snapshots.is_dir() else []  # fmt: skip
    refs_dir = folder / "refs"
    refs = sorted(p.relative_to(refs_dir).as_posix() for p in refs_dir.rglob("*") if p.is_file()) \
        if refs_dir.is_dir() else []  # fmt: skip
    return CacheEntry(f"{org}/{name}", folder, folder_size(folder), tuple(p.name for p in revisions), tuple(refs))


def folder_size(folder: Path) -> int:
    """Bytes on disk under `folder`, each file once (snapshots are symlinks into blobs)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in folder.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        stat = path.stat()
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_size
    return total
