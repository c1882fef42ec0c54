"""Usage and rate-limit budgets in a local SQLite file, so a restart loses neither.

What requests use is gathered in memory as they end (a dict update on the event loop) and
written every `flush_interval_s` in one transaction on a worker thread, with the keys'
bucket levels beside it: a request never waits on the disk (WAL, `synchronous=NORMAL`).
Rows are per key, model and hour, so `/v1/admin/usage` can answer per model and for a
time window. At start the totals come back into the ledger and each key's buckets come
back as they were, refilled for the time the server was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from modelpool.inference import RequestUsage
from modelpool.pool_api.usage import KeyUsage, LimitKind, UsageRow
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.runtime.ratelimit.usage import UsageLedger

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    account TEXT NOT NULL, model TEXT NOT NULL, hour INTEGER NOT NULL,
    requests INTEGER NOT NULL, rate_limited INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    audio_seconds_in REAL NOT NULL, audio_seconds_out REAL NOT NULL,
    PRIMARY KEY (account, model, hour)
);
CREATE TABLE IF NOT EXISTS buckets (
    account TEXT NOT NULL, kind TEXT NOT NULL, level REAL NOT NULL, saved_at REAL NOT NULL,
    PRIMARY KEY (account, kind)
);
"""
_ADD = """
INSERT INTO usage VALUES (?,?,?,?,?,?,?,?,?)
ON CONFLICT (account, model, hour) DO UPDATE SET
    requests = requests + excluded.requests, rate_limited = rate_limited + excluded.rate_limited,
    input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,
    audio_seconds_in = audio_seconds_in + excluded.audio_seconds_in,
    audio_seconds_out = audio_seconds_out + excluded.audio_seconds_out
"""
_FIELDS = "SUM(requests), SUM(rate_limited), SUM(input_tokens), SUM(output_tokens), " \
          "SUM(audio_seconds_in), SUM(audio_seconds_out)"  # fmt: skip


_Hour = tuple[str, str, int]
"""(account, model, the hour's first second): one row of the usage table."""


class UsageStore:
    def __init__(
        self,
        path: Path,
        ledger: UsageLedger,
        limiter: RateLimiter,
        flush_interval_s: float,
        busy_timeout_s: float = 5.0,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.ledger = ledger
        self.limiter = limiter
        self.flush_interval_s = flush_interval_s
        self.wall: Callable[[], float] = time.time
        self._db = sqlite3.connect(path, busy_timeout_s, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._pending: dict[_Hour, KeyUsage] = {}
        self._task: asyncio.Task[None] | None = None
        self._saved_levels: list[tuple[str, LimitKind, float]] = []
        """The bucket levels last written: an idle server writes nothing."""

    def restore(self) -> None:
        """Totals into the ledger, key budgets into the limiter (at start, before serving)."""
        with self._lock:
            rows = self._db.execute(f"SELECT account, {_FIELDS} FROM usage GROUP BY account").fetchall()
            saved = self._db.execute("SELECT account, kind, level, saved_at FROM buckets").fetchall()
        self.ledger.restore({row[0]: _usage(row[1:]) for row in rows})
        now = self.wall()
        for account, kind, level, saved_at in saved:
            self.limiter.restore([(account, _kind(kind), level)], now - saved_at)
        self.ledger.journal = self.note

    def note(self, account: str, model: str, usage: RequestUsage, requests: int, refused: int) -> None:
        """A request's use, to be written at the next flush (on the event loop: a dict update)."""
        key = (account, model, int(self.wall() // 3600) * 3600)
        total = self._pending.setdefault(key, KeyUsage())
        total.add(usage)
        total.requests += requests
        total.rate_limited += refused

    def start(self) -> None:
        self._task = asyncio.create_task(self._flushing(), name="usage store")

    async def close(self) -> None:
        """The last flush, then the file closed; never raises (the server's other teardown
        steps must run even when the disk is gone: what could not be written is logged)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.flush()
        except sqlite3.Error as exc:
            log.error("usage store: the last usage could not be written to %s: %s", self.path, exc)
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.close()

    async def flush(self) -> None:
        """Write what was noted since the last flush, and the budgets when they changed. A
        failed write keeps what it held pending (for the next flush) and raises."""
        pending, self._pending = self._pending, {}
        now = self.limiter.levels()
        levels = [] if now == self._saved_levels else [(a, kind, level, self.wall()) for a, kind, level in now]
        if not (pending or levels):
            return
        try:
            await asyncio.to_thread(self._write, pending, levels)
        except BaseException:
            self._merge_back(pending)
            raise
        if levels:
            self._saved_levels = now

    def _merge_back(self, pending: dict[_Hour, KeyUsage]) -> None:
        """What a failed write held goes back with what was noted meanwhile."""
        for key, usage in pending.items():
            total = self._pending.setdefault(key, KeyUsage())
            total.add(usage)
            total.requests += usage.requests
            total.rate_limited += usage.rate_limited

    async def query(self, since: int | None, until: int | None, by_model: bool) -> list[UsageRow]:
        """Use per key (and model) in the hours from `since` up to `until` (unix seconds)."""
        await self.flush()
        upper = 2**62 if until is None else until
        return await asyncio.to_thread(self._read, since or 0, upper, by_model)

    async def _flushing(self) -> None:
        while True:  # a failed write (a locked or full disk) is logged and tried again at the next turn
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except sqlite3.Error as exc:
                log.warning("usage store: cannot write %s, will retry: %s", self.path, exc)

    def _write(self, pending: dict[_Hour, KeyUsage], levels: Sequence[tuple[str, str, float, float]]) -> None:
        rows = [(*key, u.requests, u.rate_limited, u.input_tokens, u.output_tokens, u.audio_seconds_in,
                 u.audio_seconds_out) for key, u in pending.items()]  # fmt: skip
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(_ADD, rows)
                self._db.executemany("INSERT OR REPLACE INTO buckets VALUES (?,?,?,?)", levels)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _read(self, since: int, until: int, by_model: bool) -> list[UsageRow]:
        group = "account, model" if by_model else "account"
        query = f"SELECT {group}, {_FIELDS} FROM usage WHERE hour >= ? AND hour < ? GROUP BY {group} ORDER BY {group}"
        with self._lock:
            rows = self._db.execute(query, (since // 3600 * 3600, until)).fetchall()
        if by_model:
            return [UsageRow(row[0], row[1], _usage(row[2:])) for row in rows]
        return [UsageRow(row[0], None, _usage(row[1:])) for row in rows]


def _usage(row: tuple[float | None, ...]) -> KeyUsage:
    requests, refused, tokens_in, tokens_out, audio_in, audio_out = (value or 0 for value in row)
    return KeyUsage(int(tokens_in), int(tokens_out), float(audio_in), float(audio_out),
                    requests=int(requests), rate_limited=int(refused))  # fmt: skip


def _kind(kind: str) -> LimitKind:
    return "tokens" if kind == "tokens" else "requests"
