"""Swaps that do not thrash (runtime/capacity.py over eviction.decide_swap), through a pool of
fake backends: a busy model is not thrown out for another model's load; the load waits and
the resident model's requests go first; past `swap_after_s` the busy model is drained."""

from __future__ import annotations

import asyncio

import pytest

from modelpool.backends.base import MemoryEstimate
from modelpool.errors import ShuttingDown
from modelpool.inference import ChatMessage, ChatRequest, GenerationChunk
from modelpool.pool_api.generation import collect
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.eviction import Budget
from modelpool.runtime.lease import LeasedStream
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot
from tests.fakes import FakeBackend, FakePool
from tests.polling import until

REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


async def a_busy_resident(
    fakes: FakePool,
) -> tuple[asyncio.Event, ModelSlot, ModelSlot, ModelPool, LeasedStream[GenerationChunk]]:
    """Two models of 600 in a pool that holds one: `resident`, loaded and running a request
    held by `step`, and `wanted`, not loaded."""
    step = asyncio.Event()
    resident = fakes.slot(FakeBackend(memory=600, step=step), "resident")
    wanted = fakes.slot(FakeBackend(memory=600), "wanted")
    pool = fakes.pool()
    return step, resident, wanted, pool, await pool.chat("resident", REQUEST)


async def test_a_pending_swap_waits_while_the_resident_has_work_and_the_residents_requests_go_first() -> None:
    fakes = FakePool(memory_bytes=1000)
    step = asyncio.Event()
    resident = fakes.slot(FakeBackend(memory=600, step=step), "resident")
    wanted = fakes.slot(FakeBackend(memory=600), "wanted")
    pool = fakes.pool()
    running = await pool.chat("resident", REQUEST)  # work in flight (held by `step`)
    swap = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the swap to be pending")
    later = await pool.chat("resident", REQUEST)  # arrives after the swap: served first, by the resident
    assert resident.state is SlotState.READY and not swap.done()
    step.set()
    assert [await collect(s) for s in (running, later)]  # the resident's work ends: it is idle now
    await collect(await swap)  # ... and the pending swap goes ahead
    assert (resident.state, wanted.state) == (SlotState.UNLOADED, SlotState.READY)


async def test_past_swap_after_s_the_busy_resident_is_drained_not_cut_off() -> None:
    fakes = FakePool(memory_bytes=1000)
    fakes.capacity.swap_after_s = 0.0  # the bound is already past
    step, resident, wanted, pool, running = await a_busy_resident(fakes)
    swap = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: resident.state is SlotState.UNLOADING, "the busy resident to drain")
    step.set()
    result = await collect(running)  # its running request finished whole
    assert result.text.split() == ["one", "two", "three"]
    await collect(await swap)
    assert (resident.state, wanted.state) == (SlotState.UNLOADED, SlotState.READY)


class _EstimateOffTheLoop(FakeBackend):
    async def estimate_memory(self) -> MemoryEstimate:
        await asyncio.sleep(0.01)  # a real engine reads its file off the loop: both loads reach make_room
        return await super().estimate_memory()


@pytest.mark.parametrize(
    ("budget", "fields", "backend"),
    [
        pytest.param({"memory_bytes": 1000}, {"memory_bytes": 600}, FakeBackend, id="memory declared in config"),
        pytest.param({"memory_bytes": 1000}, {}, _EstimateOffTheLoop, id="estimates that both finish first"),
        pytest.param({"max_models": 1}, {}, FakeBackend, id="max_loaded_models 1"),
    ],
)
async def test_two_loads_at_once_that_cannot_both_fit_both_serve_one_after_the_other(
    budget: dict[str, int], fields: dict[str, object], backend: type[FakeBackend]
) -> None:
    fakes = FakePool()
    fakes.capacity.budget = Budget(**budget)
    b = fakes.slot(backend(memory=600), "b", **fields)
    c = fakes.slot(backend(memory=600), "c", **fields)
    pool = fakes.pool()

    async def ask(model: str) -> str:
        return (await collect(await pool.chat(model, REQUEST))).text

    async with asyncio.timeout(10):  # before the fix each waited for the other's load: forever
        answers = await asyncio.gather(ask("b"), ask("c"))
    assert [a.split() for a in answers] == [["one", "two", "three"]] * 2
    assert {b.state, c.state} == {SlotState.READY, SlotState.UNLOADED}  # the first went idle and made room


async def test_shutdown_ends_a_pending_swap_at_once() -> None:
    fakes = FakePool(memory_bytes=1000)
    step = asyncio.Event()
    fakes.slot(FakeBackend(memory=600, step=step), "resident")
    wanted = fakes.slot(FakeBackend(memory=600), "wanted")
    pool = fakes.pool()
    running = await pool.chat("resident", REQUEST)
    swap = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the swap to be pending")
    closing = asyncio.create_task(pool.close())
    await until(swap.done, "the pending swap to give up")  # while the resident still runs
    with pytest.raises(ShuttingDown):
        swap.result()
    step.set()
    await collect(running)  # the resident's running request still finishes whole
    async with asyncio.timeout(10):
        await closing
    assert wanted.state is not SlotState.READY


async def test_a_load_whose_requests_all_left_stops_and_the_busy_resident_stays() -> None:
    """A client that asks for another model and leaves (times out, disconnects) must not
    have a busy resident drained for a load nobody waits for: two loads per tiny request."""
    fakes = FakePool(memory_bytes=1000)
    step, resident, wanted, pool, running = await a_busy_resident(fakes)
    asked = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the pending swap the request started")
    asked.cancel()  # the client left
    await until(lambda: wanted.state is SlotState.UNLOADED, "the load to stop")
    assert resident.state is SlotState.READY  # not drained
    assert wanted.record.error is None  # stopped, not failed: the next request loads it afresh
    step.set()
    assert (await collect(running)).text.split() == ["one", "two", "three"]
    await collect(await pool.chat("wanted", REQUEST))  # asked again, and waited for: the swap goes ahead
    assert (resident.state, wanted.state) == (SlotState.UNLOADED, SlotState.READY)


class _GatedEstimate(FakeBackend):
    gate: asyncio.Event

    async def estimate_memory(self) -> MemoryEstimate:
        await self.gate.wait()  # the load is under way, not yet making room
        return await super().estimate_memory()


async def test_an_idle_resident_is_not_evicted_for_a_load_whose_requests_left() -> None:
    fakes = FakePool(memory_bytes=1000)
    resident = fakes.slot(FakeBackend(memory=600), "resident")
    gated = _GatedEstimate(memory=600)
    gated.gate = asyncio.Event()
    wanted = fakes.slot(gated, "wanted")
    pool = fakes.pool()
    await collect(await pool.chat("resident", REQUEST))  # loaded, and idle now
    asked = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the load the request started")
    asked.cancel()
    gated.gate.set()
    await until(lambda: wanted.state is SlotState.UNLOADED, "the load to stop")
    assert resident.state is SlotState.READY


async def test_an_admin_load_goes_on_without_requests_waiting() -> None:
    fakes = FakePool(memory_bytes=1000)
    fakes.capacity.swap_after_s = 0.0
    step, resident, wanted, _, running = await a_busy_resident(fakes)
    load = asyncio.create_task(wanted.ensure_ready(None, explicit=True))
    await until(lambda: resident.state is SlotState.UNLOADING, "the busy resident to drain for the admin's load")
    step.set()
    await collect(running)
    await load
    assert wanted.state is SlotState.READY


async def test_a_client_that_keeps_asking_and_leaving_still_gets_its_swap() -> None:
    """The wait for room counts from the first ask while the asks keep coming: a client that
    leaves after 20 s each time still gets its model after `swap_after_s` (30 s) of asking."""
    fakes = FakePool(memory_bytes=1000)
    fakes.capacity = Capacity(Budget(memory_bytes=1000), lambda: fakes.slots, swap_after_s=30.0,
                              clock=fakes.clock.monotonic)  # fmt: skip
    step, resident, wanted, pool, running = await a_busy_resident(fakes)
    first = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the pending swap")
    fakes.clock.advance(20)
    first.cancel()
    await until(lambda: wanted.state is SlotState.UNLOADED, "the first load to stop")
    fakes.clock.advance(1)
    second = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: wanted.state is SlotState.LOADING, "the second ask's load")
    fakes.clock.advance(10)  # 31 s since the first ask, 10 s since the second
    await until(lambda: resident.state is SlotState.UNLOADING, "the busy resident to drain")
    step.set()
    await collect(running)
    await collect(await second)
    assert wanted.state is SlotState.READY
