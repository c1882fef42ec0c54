"""The durable usage store on its own: hour rows, the windows `/v1/admin/usage` asks for,
and a reopened file giving back the same totals and budgets (a fake clock throughout)."""

from __future__ import annotations

from pathlib import Path

from modelpool.pool_api.usage import Limits, RequestUsage
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.runtime.ratelimit.usage import UsageLedger
from tests.fakes import ManualClock

HOUR = 3600
T0 = 1_700_000_000 // HOUR * HOUR  # an hour's first second


def opened(path: Path, clock: ManualClock, wall: list[float]) -> tuple[UsageStore, UsageLedger, RateLimiter]:
    ledger = UsageLedger(Metrics())
    limiter = RateLimiter({"alice": Limits(requests_per_minute=2)}, Limits(), clock)
    store = UsageStore(path, ledger, limiter, flush_interval_s=60)
    store.wall = lambda: wall[0]
    store.restore()
    return store, ledger, limiter


async def test_rows_per_hour_and_the_windows_asked_for(tmp_path: Path) -> None:
    wall = [T0 + 10.0]
    store, ledger, _ = opened(tmp_path / "usage.sqlite", ManualClock(), wall)
    ledger.record("alice", RequestUsage(input_tokens=3, output_tokens=4), "chat")
    wall[0] = T0 + HOUR + 5  # the next hour
    ledger.record("alice", RequestUsage(input_tokens=10), "embed")
    ledger.record("bob", RequestUsage(output_tokens=1), "chat")
    ledger.refused("alice", "requests")

    everything = {row.account: row.usage for row in await store.query(None, None, by_model=False)}
    assert (everything["alice"].requests, everything["alice"].rate_limited) == (2, 1)
    assert (everything["alice"].input_tokens, everything["alice"].output_tokens) == (13, 4)

    first_hour = await store.query(T0, T0 + HOUR, by_model=False)  # end_time is exclusive
    assert [(r.account, r.usage.requests, r.usage.input_tokens) for r in first_hour] == [("alice", 1, 3)]
    mid_hour_start = await store.query(T0 + HOUR + 1800, None, by_model=False)  # the hour it falls in counts
    assert {r.account: r.usage.requests for r in mid_hour_start} == {"alice": 1, "bob": 1}
    assert await store.query(T0 + 2 * HOUR, None, by_model=False) == []  # nothing yet
    per_model = await store.query(0, None, by_model=True)
    assert [(r.account, r.model, r.usage.requests) for r in per_model] == [
        ("alice", "", 0), ("alice", "chat", 1), ("alice", "embed", 1), ("bob", "chat", 1)]  # fmt: skip
    await store.close()


async def test_a_reopened_file_gives_back_totals_and_spent_budgets(tmp_path: Path) -> None:
    path, clock, wall = tmp_path / "usage.sqlite", ManualClock(), [T0 + 100.0]
    store, ledger, limiter = opened(path, clock, wall)
    alice = limiter.caller("alice", None)
    limiter.admit(alice)
    limiter.admit(alice)  # both of the minute's requests spent
    ledger.record("alice", RequestUsage(input_tokens=5, output_tokens=6), "chat")
    ledger.record("alice", RequestUsage(input_tokens=1), "chat")
    before = ledger.totals()
    await store.close()

    reopened, ledger_after, limiter_after = opened(path, ManualClock(), wall)  # no time passed
    assert ledger_after.totals() == before
    assert [state.remaining for state in limiter_after.states(limiter_after.caller("alice", None))] == [0]
    await reopened.close()

    wall[0] += 30  # down for half a minute: one of the two requests came back
    third, _, limiter_later = opened(path, ManualClock(), wall)
    assert [state.remaining for state in limiter_later.states(limiter_later.caller("alice", None))] == [1]
    assert {r.account: r.usage.requests for r in await third.query(None, None, by_model=False)} == {"alice": 2}
    await third.close()
