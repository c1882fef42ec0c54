"""One server per usage file: an exclusive lock on a sidecar `<file>.lock`.

Two servers writing one usage file would silently share their keys' budgets (each restores
the other's levels and overwrites them). The first server to start takes the lock and keeps
it until its store closes; a second one finds it taken and keeps its usage in memory
(`add_rate_limits` warns). `flock` is released by the kernel when the process dies, so a
crashed server never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from modelpool.runtime.ratelimit.durable import UsageStore


class UsageFileLock:
    def __init__(self, usage_file: Path) -> None:
        self.path = usage_file.with_name(usage_file.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting: False when another open holds it (another server)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the lock

    def __del__(self) -> None:  # an app dropped without its lifespan ever closing the store
        self.release()


class LockedUsageStore(UsageStore):
    """The store, holding its file's lock until it closes."""

    lock: UsageFileLock | None = None

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self.lock is not None:
                self.lock.release()
