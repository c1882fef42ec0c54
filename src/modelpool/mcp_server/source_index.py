"""The transcript store's index: which file holds which source, shared by every process
that uses the same directory.

Finding a source's file is a dict look-up; a new source costs a stat of the sidecar, a
stat of its candidate file name and one sidecar write. No other source's file is opened
and the directory is listed only once, when the index is made.

Processes share the directory through the identity sidecar (`identity.py`). Every change
to it is made under an exclusive `flock` of `.lock` in the directory, after reading back
what the others wrote since (only when the sidecar's inode, size or mtime changed), so one
process never writes the sidecar from a stale view and drops another's sources.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from modelpool.mcp_server import identity
from modelpool.mcp_server.identity import SIDECAR, SourceKey

LOCK = ".lock"
_Signature = tuple[int, int, int]


class SourceIndex:
    """Not thread-safe: the store calls it under its own lock."""

    def __init__(self, directory: Path) -> None:
        """Reads the sidecar (if any) and the directory's file names, once."""
        self.directory = directory
        self._files: dict[str, SourceKey] = {}
        self._by_key: dict[SourceKey, str] = {}
        self._taken = {path.name.casefold() for path in directory.iterdir()} if directory.is_dir() else set()
        self._seen: _Signature | None = None
        self.merge()

    def __len__(self) -> int:
        return len(self._files)

    def files(self) -> dict[str, SourceKey]:
        return dict(self._files)

    def file_of(self, key: SourceKey) -> str | None:
        return self._by_key.get(key)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes (and across stores of one process) while the block
        runs. Closing the lock file releases the lock, also when the process dies."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / LOCK).open("ab") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield

    def merge(self) -> dict[str, SourceKey]:
        """Take in the sources other processes added since this index last read or wrote
        the sidecar; returns them (file name → key). Call under `locked()` to be exact."""
        seen = _signature(self.directory / SIDECAR)
        if seen is None or seen == self._seen:
            return {}
        new = {name: key for name, key in identity.read_sidecar(self.directory).items() if name not in self._files}
        for name, key in new.items():
            self._record(name, key)
        self._seen = seen
        return new

    def add(self, key: SourceKey) -> str:
        """Name a file for a new source and record it in the sidecar. Call under `locked()`,
        after `merge()`, so the sidecar written holds every process's sources."""
        name = identity.unused_name(key[1], self._is_taken)
        identity.write_sidecar(self.directory, {**self._files, name: key})
        self._record(name, key)
        self._seen = _signature(self.directory / SIDECAR)
        return name

    def _record(self, name: str, key: SourceKey) -> None:
        self._files[name] = key
        self._by_key.setdefault(key, name)  # a key twice (an old unlocked writer): the first file
        self._taken.add(name.casefold())

    def _is_taken(self, name: str) -> bool:
        """Known to the index or listed at start (case-insensitively, as macOS and Windows
        compare names), or on the disk now (a file copied in since, which stays untouched)."""
        return name.casefold() in self._taken or (self.directory / name).exists()


def _signature(path: Path) -> _Signature | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
