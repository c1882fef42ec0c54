"""The transcript store's index: which file holds which source, shared by every process
that uses the same directory.

Finding a source's file is a dict look-up. A new source costs a stat of its candidate file
name and one appended journal line (`identity.append_journal`): no other source's file is
opened, the directory is listed only once (when the index is made), and the sidecar is
rewritten whole only when the journal has grown to half the sidecar's sources or 1,000
lines, so its cost spreads over the sources added since (a constant per source).

Processes share the directory through the sidecar and the journal. Every change to them
is made under an exclusive `flock` of `.lock`, after taking in what the others added since
(the journal's new lines; the whole sidecar again only when another process rewrote it),
so no process writes from a stale view, drops another's sources or takes a file name
another has given.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from modelpool.mcp_server import identity
from modelpool.mcp_server.identity import JOURNAL, SIDECAR, SourceKey

LOCK = ".lock"
FOLD_AT_LEAST = 1_000
"""Journal lines that never trigger a rewrite of the sidecar below this many."""
_Signature = tuple[int, int, int]


class SourceIndex:
    """Not thread-safe: the store calls it under its own lock."""

    def __init__(self, directory: Path) -> None:
        """Reads the sidecar and journal (if any) and the directory's file names, once."""
        self.directory = directory
        self._files: dict[str, SourceKey] = {}
        self._by_key: dict[SourceKey, str] = {}
        self._taken = {path.name.casefold() for path in directory.iterdir()} if directory.is_dir() else set()
        self._sidecar_seen: _Signature | None = None
        self._journal_read = 0
        """Bytes of the journal taken in."""
        self._journalled = 0
        """Sources the journal holds (those the sidecar does not, as far as this index knows)."""
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
        """Take in the sources other processes added since this index last looked; returns
        them (file name → key). A stat of the sidecar and of the journal when there are none.
        Call under `locked()` before a change; without it (a read) it may see a change half
        made, which the next call completes: a name, once given, keeps its source."""
        sidecar, journal = _signature(self.directory / SIDECAR), identity.journal_size(self.directory)
        new: dict[str, SourceKey] = {}
        if sidecar != self._sidecar_seen or journal < self._journal_read:
            new = self._take(identity.read_sidecar(self.directory))  # rewritten by another: all again
            self._sidecar_seen, self._journal_read, self._journalled = sidecar, 0, 0
        if journal > self._journal_read:
            journalled, self._journal_read = identity.read_journal(self.directory, self._journal_read)
            self._journalled += len(journalled)
            new.update(self._take(journalled))
        return new

    def add(self, key: SourceKey) -> str:
        """Name a file for a new source and journal it. Call under `locked()`, after
        `merge()`, so the name is unique among every process's sources."""
        name = identity.unused_name(key[1], self._is_taken)
        self._journal_read = identity.append_journal(self.directory, name, key)
        self._journalled += 1
        self._take({name: key})
        if self._journalled >= max(FOLD_AT_LEAST, (len(self._files) - self._journalled) // 2):
            self._fold()
        return name

    def _fold(self) -> None:
        """The journal into the sidecar: the sidecar is written whole (fsynced, renamed into
        place), then the journal emptied. A crash between leaves lines the sidecar already
        holds, which read as the same sources again."""
        identity.write_sidecar(self.directory, self._files)
        os.truncate(self.directory / JOURNAL, 0)
        self._sidecar_seen, self._journal_read, self._journalled = _signature(self.directory / SIDECAR), 0, 0

    def _take(self, files: dict[str, SourceKey]) -> dict[str, SourceKey]:
        new = {name: key for name, key in files.items() if name not in self._files}
        for name, key in new.items():
            self._files[name] = key
            self._by_key.setdefault(key, name)  # a key twice (an old unlocked writer): the first file
            self._taken.add(name.casefold())
        return new

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
