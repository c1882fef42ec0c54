"""The batches' SQLite database: one connection, used from worker threads one call at a
time (a lock), in WAL mode so a commit is one append, never on the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, lines INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, status TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, output TEXT NOT NULL,
    tokens_in INTEGER NOT NULL, tokens_out INTEGER NOT NULL,
    PRIMARY KEY (batch_id, line)
);
"""


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a crash of the process
        self._db.executescript(_SCHEMA)

    def now(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` here, in one transaction (for start-up and tests, off the event loop)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                result = work(self._db)
                self._db.execute("COMMIT")  # inside: a COMMIT that fails (a locked file) rolls back too
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            return result

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` on a worker thread, in one transaction."""
        return await asyncio.to_thread(self.now, work)

    def close(self) -> None:
        with self._lock:
            self._db.close()
