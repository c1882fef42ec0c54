from __future__ import annotations

import asyncio

import numpy as np
import pytest

from modelpool.config.schema import BatchConfig
from modelpool.errors import ModelUnloaded
from modelpool.runtime.batching import Batcher
from tests.polling import until


class GatedEmbedder:
    """Counts calls; the first call waits for `gate`, so requests pile up behind it."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[list[int]]] = []
        self.gate = asyncio.Event()
        self.fail_on = fail_on

    async def __call__(self, ids: list[list[int]]) -> np.ndarray:
        self.calls.append(ids)
        if len(self.calls) == 1:
            await self.gate.wait()
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("engine exploded")
        return np.array([[float(i[0]), float(len(i))] for i in ids], dtype=np.float32)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_arriving_together_share_one_call_and_get_their_own_rows() -> None:
    embed = GatedEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=10, window_ms=0), "m")
    blocker = asyncio.create_task(batcher.run([[0]]))
    await settle()
    waiting = [asyncio.create_task(batcher.run([[i], [i, i]])) for i in range(1, 4)]
    await settle()
    embed.gate.set()
    await blocker
    results = await asyncio.gather(*waiting)
    assert len(embed.calls) == 2 and len(embed.calls[1]) == 6  # three requests, one call
    for i, rows in enumerate(results, start=1):
        np.testing.assert_array_equal(rows, [[i, 1], [i, 2]])
    await batcher.close()


async def test_batches_respect_size_and_token_limits() -> None:
    embed = GatedEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=3, max_batch_tokens=8, window_ms=0), "m")
    blocker = asyncio.create_task(batcher.run([[0]]))
    await settle()
    jobs = [asyncio.create_task(batcher.run([[i, i]])) for i in range(1, 6)]
    await settle()
    embed.gate.set()
    await asyncio.gather(blocker, *jobs)
    sizes = [len(call) for call in embed.calls[1:]]
    assert sizes == [3, 2]  # 3 inputs of 2 tokens = 6 ≤ 8 padded tokens; size cap 3
    await batcher.close()


async def test_a_failing_batch_fails_each_of_its_requests_and_the_worker_goes_on() -> None:
    embed = GatedEmbedder(fail_on=2)
    batcher = Batcher(embed, BatchConfig(max_batch_size=10, window_ms=0), "m")
    blocker = asyncio.create_task(batcher.run([[0]]))
    await settle()
    doomed = [asyncio.create_task(batcher.run([[i]])) for i in range(1, 3)]
    await settle()
    embed.gate.set()
    await blocker
    for task in doomed:
        with pytest.raises(RuntimeError, match="engine exploded"):
            await task
    rows = await batcher.run([[7]])  # the worker survived
    np.testing.assert_array_equal(rows, [[7, 1]])
    await batcher.close()


async def test_callers_that_went_away_are_skipped() -> None:
    embed = GatedEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=10, window_ms=0), "m")
    blocker = asyncio.create_task(batcher.run([[0]]))
    await settle()
    gone = asyncio.create_task(batcher.run([[99]]))
    stays = asyncio.create_task(batcher.run([[5]]))
    await settle()
    gone.cancel()
    await settle()
    embed.gate.set()
    await blocker
    np.testing.assert_array_equal(await stays, [[5, 1]])
    assert [ids for call in embed.calls for ids in call] == [[0], [5]]
    await batcher.close()


class Arrivals:
    """A `pause` for the batcher that lets one more request arrive during each wait, as a
    burst the event loop is still reading does, until `count` have come."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.batcher: Batcher[list[int]] | None = None
        self.pauses = 0
        self.callers: list[asyncio.Task[np.ndarray]] = []

    async def __call__(self, seconds: float) -> None:
        self.pauses += 1
        if self.left and self.batcher is not None:
            self.left -= 1
            self.callers.append(asyncio.create_task(self.batcher.run([[len(self.callers) + 1]])))
            await settle()


async def test_a_burst_that_keeps_arriving_past_the_window_still_makes_one_batch() -> None:
    embed = GatedEmbedder()
    embed.gate.set()
    arrivals = Arrivals(count=5)  # one request per window, five windows in a row
    config = BatchConfig(window_ms=2, max_window_ms=10_000)
    batcher = arrivals.batcher = Batcher(embed, config, "m", pause=arrivals)
    first = await batcher.run([[0]])
    rows = await asyncio.gather(*arrivals.callers)
    assert [len(call) for call in embed.calls] == [6]  # a fixed window would have cut it after the first
    assert arrivals.pauses == 6  # five windows that saw a newcomer, then one quiet window
    np.testing.assert_array_equal(first, [[0, 1]])
    for i, row in enumerate(rows, start=1):
        np.testing.assert_array_equal(row, [[i, 1]])
    await batcher.close()


async def test_a_full_batch_stops_waiting_for_more() -> None:
    embed = GatedEmbedder()
    embed.gate.set()
    arrivals = Arrivals(count=2)
    config = BatchConfig(max_batch_size=3, window_ms=2, max_window_ms=10_000)
    batcher = arrivals.batcher = Batcher(embed, config, "m", pause=arrivals)
    await batcher.run([[0]])
    await asyncio.gather(*arrivals.callers)
    assert [len(call) for call in embed.calls] == [3]
    assert arrivals.pauses == 2  # full at three: it ran without waiting a quiet window
    await batcher.close()


async def test_the_arrival_that_fills_a_batch_ends_its_window_at_once() -> None:
    """With the batcher's own pause, a full batch runs when its last input arrives, not when
    the window ends: a lane freed under load would otherwise sit idle through the window."""
    embed = GatedEmbedder()
    embed.gate.set()
    config = BatchConfig(max_batch_size=3, window_ms=600_000, max_window_ms=10_000)
    batcher: Batcher[list[int]] = Batcher(embed, config, "m")
    first = asyncio.create_task(batcher.run([[0]]))
    await settle()
    assert embed.calls == []  # waiting in its window for more
    rest = [asyncio.create_task(batcher.run([[i]])) for i in (1, 2)]
    await asyncio.wait_for(asyncio.gather(first, *rest), timeout=30)  # the window is ten minutes
    assert [len(call) for call in embed.calls] == [3]
    await batcher.close()


async def test_the_queued_count_follows_arrivals_leavers_and_taken_batches() -> None:
    """Each arrival asks whether a filling batch is full from a running count, not a walk of
    the queue (a flood would make that quadratic): the count must stay the queue's inputs."""
    embed = GatedEmbedder()
    batcher: Batcher[list[int]] = Batcher(embed, BatchConfig(window_ms=0, max_batch_size=4), "m")

    def counted() -> tuple[int, int]:
        return batcher._queued(), sum(len(job.ids) for job in batcher._jobs)

    blocker = asyncio.create_task(batcher.run([[0]]))
    await settle()  # the first batch computes behind the gate
    callers = [asyncio.create_task(batcher.run([[i]] * size)) for i, size in enumerate((3, 1, 2, 5), start=1)]
    await settle()
    assert counted() == (11, 11)
    callers[1].cancel()  # a caller that went away: its inputs leave as the next batch is taken
    await settle()
    embed.gate.set()
    await asyncio.gather(blocker, *(c for i, c in enumerate(callers) if i != 1))
    assert counted() == (0, 0)
    assert [len(call) for call in embed.calls] == [1, 3, 2, 5]  # the cancelled one skipped
    await batcher.close()
    assert counted() == (0, 0)


async def test_endless_arrivals_wait_no_longer_than_max_window() -> None:
    """Requests that never stop coming (each well within `window_ms` of the last) still get
    a batch run: the wait is capped by `max_window_ms`."""
    ran = asyncio.Event()

    async def compute(ids: list[list[int]]) -> np.ndarray:
        ran.set()
        return np.zeros((len(ids), 1), dtype=np.float32)

    config = BatchConfig(max_batch_size=10_000, window_ms=50, max_window_ms=100)
    batcher: Batcher[list[int]] = Batcher(compute, config, "m")
    stop = asyncio.Event()
    callers: list[asyncio.Task[np.ndarray]] = []

    async def flood() -> None:
        while not stop.is_set():
            callers.append(asyncio.create_task(batcher.run([[1]])))
            await asyncio.sleep(0.001)

    flooding = asyncio.create_task(flood())
    await asyncio.wait_for(ran.wait(), 30)  # the flood is still going: only the cap let it run
    assert not flooding.done()
    stop.set()
    await flooding
    assert all(len(rows) == 1 for rows in await asyncio.gather(*callers))
    await batcher.close()


# ----- several batches in flight (an engine with compute lanes) ---------------------------


class HeldEmbedder:
    """Each call waits until the test releases it; records what each call got."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []
        self.release: list[asyncio.Event] = []

    async def __call__(self, ids: list[list[int]]) -> np.ndarray:
        self.calls.append(ids)
        gate = asyncio.Event()
        self.release.append(gate)
        await gate.wait()
        return np.array([[float(i[0])] for i in ids], dtype=np.float32)


async def test_queued_inputs_are_shared_between_free_slots_and_started_together() -> None:
    embed = HeldEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=32, window_ms=0), "m", concurrency=2)
    callers = [asyncio.create_task(batcher.run([[i]])) for i in range(32)]
    await settle()
    assert [len(call) for call in embed.calls] == [16, 16]  # two halves, both computing
    for gate in embed.release:
        gate.set()
    rows = await asyncio.gather(*callers)
    assert [float(r[0][0]) for r in rows] == list(range(32))
    await batcher.close()


async def test_a_batch_gathers_and_starts_while_another_computes() -> None:
    embed = HeldEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=32, window_ms=0), "m", concurrency=2)
    first = asyncio.create_task(batcher.run([[0]]))
    await settle()
    later = [asyncio.create_task(batcher.run([[i]])) for i in range(1, 5)]
    await settle()
    assert [len(call) for call in embed.calls] == [1, 4]  # the second started; the first still computes
    third = asyncio.create_task(batcher.run([[5]]))
    await settle()
    assert len(embed.calls) == 2  # both slots taken: it waits
    embed.release[1].set()
    await asyncio.gather(*later)
    await settle()
    assert [len(call) for call in embed.calls] == [1, 4, 1]  # a slot freed: it started
    embed.release[0].set()
    embed.release[2].set()
    assert float((await first)[0][0]) == 0 and float((await third)[0][0]) == 5
    await batcher.close()


async def test_closing_fails_every_batch_in_flight_and_every_queued_request() -> None:
    embed = HeldEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=2, window_ms=0), "m", concurrency=2)
    callers = [asyncio.create_task(batcher.run([[i]])) for i in range(6)]
    await settle()
    assert [len(call) for call in embed.calls] == [2, 2]
    await batcher.close()
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(outcome, ModelUnloaded) for outcome in outcomes), outcomes


class Scripted:
    """A `pause` that sleeps as asked (so `max_window_ms` passes) and lets the scripted number
    of requests arrive during each wait: a cohort read with gaps in it."""

    def __init__(self, batcher: Batcher[list[int]], script: list[int]) -> None:
        self.batcher, self.script = batcher, list(script)
        self.callers: list[asyncio.Task[np.ndarray]] = []

    async def __call__(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        for _ in range(self.script.pop(0) if self.script else 0):
            self.callers.append(asyncio.create_task(self.batcher.run([[100 + len(self.callers)]])))
        await settle()


async def test_a_freed_slot_waits_through_a_quiet_window_for_its_fair_share() -> None:
    """A request of 8 inputs computes in one slot; for the other, 1 request waits, then 1
    more comes, a quiet window, 2, another quiet window, 1. The fair share of all the inputs
    is over 5, so the batch does not start at the first quiet window (which does end a wait
    from idle, as the first batch's shows) but takes all 5 when `max_window_ms` ends it."""
    embed = HeldEmbedder()
    config = BatchConfig(max_batch_size=32, window_ms=2, max_window_ms=100)
    batcher = Batcher(embed, config, "m", concurrency=2)
    script = Scripted(batcher, [0, 1, 0, 2, 0, 1])
    batcher._pause = script
    big = asyncio.create_task(batcher.run([[i] for i in range(8)]))
    await until_calls(embed, 1)
    first = asyncio.create_task(batcher.run([[50]]))
    await until_calls(embed, 2)
    assert [len(call) for call in embed.calls] == [8, 5]
    for gate in embed.release:
        gate.set()
    rows = await asyncio.gather(big, first, *script.callers)
    assert [float(r[0][0]) for r in rows[1:]] == [50, 100, 101, 102, 103]
    await batcher.close()


async def test_a_freed_slot_takes_no_more_than_a_fair_share_and_leaves_the_rest() -> None:
    """One input computes; 27 queued for the free slot: it takes 14 ((27 + 1) / 2), and the
    other 13 start together when the first slot frees: the two batches stay even."""
    embed = HeldEmbedder()
    batcher = Batcher(embed, BatchConfig(max_batch_size=64, window_ms=2, max_window_ms=50), "m", concurrency=2)
    lone = asyncio.create_task(batcher.run([[0]]))
    await until_calls(embed, 1)
    burst = [asyncio.create_task(batcher.run([[i]])) for i in range(1, 28)]
    await until_calls(embed, 2)
    assert [len(call) for call in embed.calls] == [1, 14]
    embed.release[0].set()
    await until_calls(embed, 3)
    assert [len(call) for call in embed.calls] == [1, 14, 13]
    for gate in embed.release:
        gate.set()
    rows = await asyncio.gather(lone, *burst)
    assert [float(r[0][0]) for r in rows] == list(range(28))
    await batcher.close()


async def until_calls(embed: HeldEmbedder, count: int) -> None:
    await until(lambda: len(embed.calls) >= count, f"{count} engine calls")
