"""A folder built once into a cache and then reused (a GGUF de-quantised for transformers,
a model converted for CTranslate2, split weights joined): safe when threads of one process
(replicas loading at once) or several processes (two servers, two test lanes) build it at
the same time. Readers only ever see a whole folder: it appears by one rename."""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Held while `target` is built: a lock for this process's threads, then an exclusive
    flock on `TARGET.lock` for other processes. Check again inside for a folder another
    builder finished while this one waited. The lock file stays: removing it could let a
    third process lock a new file while one still holds the old."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(target, threading.Lock())
    with lock:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_name(target.name + ".lock"), "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes
            yield


@contextlib.contextmanager
def building(target: Path) -> Iterator[Path]:
    """A private, empty folder beside `target` to build into. When the block ends cleanly it
    becomes `target` by one rename; if `target` already exists (a builder without the lock
    finished first) that folder is kept and this one dropped. Removed on any error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    try:
        yield partial
        try:
            partial.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
