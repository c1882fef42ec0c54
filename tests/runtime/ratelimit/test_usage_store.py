"""The durable usage store when its file cannot be written (another process holds the write
lock): the transaction is rolled back, what it held stays pending and is written once the
lock is gone, the flush task goes on, and closing never raises (the server's other teardown
steps must still run)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from modelpool.config.schema import AuthConfig
from modelpool.inference import RequestUsage
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.runtime.ratelimit.usage import UsageLedger
from tests.polling import until


def store_at(path: Path, flush_interval_s: float = 3600) -> UsageStore:
    limiter = RateLimiter.from_config(AuthConfig())
    store = UsageStore(path, UsageLedger(Metrics()), limiter, flush_interval_s, busy_timeout_s=0.05)
    store.restore()
    return store


def stored_tokens(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COALESCE(SUM(input_tokens), 0) FROM usage").fetchone()[0])


def holding_the_write_lock(path: Path) -> sqlite3.Connection:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_a_failed_write_rolls_back_keeps_the_usage_and_is_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "usage.sqlite"
    store = store_at(path, flush_interval_s=0.02)
    store.note("alice", "m", RequestUsage(input_tokens=7), requests=1, refused=0)
    other = holding_the_write_lock(path)
    with pytest.raises(sqlite3.OperationalError):
        await store.flush()
    assert not store._db.in_transaction  # rolled back: the next BEGIN can start
    store.note("alice", "m", RequestUsage(input_tokens=5), requests=1, refused=0)
    with caplog.at_level(logging.WARNING):
        store.start()
        await until(lambda: "will retry" in caplog.text, "the flush task logs the failed write")
    assert store._task is not None and not store._task.done()  # it survived the error
    other.execute("ROLLBACK")
    await until(lambda: stored_tokens(path) == 12, "both notes written once the lock is gone")
    await store.close()


async def test_close_never_raises_when_the_last_flush_fails(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite"
    store = store_at(path)
    store.note("alice", "m", RequestUsage(input_tokens=3), requests=1, refused=0)
    other = holding_the_write_lock(path)
    await store.close()
    assert "could not be written" in caplog.text
    other.execute("ROLLBACK")
    other.close()


async def test_an_idle_store_writes_nothing_and_end_time_zero_is_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite"
    store = store_at(path)
    store.note("alice", "m", RequestUsage(input_tokens=3), requests=1, refused=0)
    await store.flush()
    other = holding_the_write_lock(path)  # a write now would fail: an idle flush must not try one
    await store.flush()
    other.execute("ROLLBACK")
    other.close()
    assert await store.query(0, 0, by_model=False) == []  # end_time=0: nothing before 1970
    assert [row.usage.input_tokens for row in await store.query(0, None, by_model=False)] == [3]
    await store.close()
