"""Swaps that do not thrash (runtime/capacity.py over eviction.decide_swap), through a pool of
fake backends: a busy model is not thrown out for another model's load; the load waits and
the resident model's requests go first; past `swap_after_s` the busy model is drained."""

from __future__ import annotations

import asyncio

from modelpool.inference import ChatMessage, ChatRequest
from modelpool.pool_api.generation import collect
from modelpool.runtime.lifecycle import SlotState
from tests.fakes import FakeBackend, FakePool
from tests.polling import until

REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


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
    step = asyncio.Event()
    resident = fakes.slot(FakeBackend(memory=600, step=step), "resident")
    wanted = fakes.slot(FakeBackend(memory=600), "wanted")
    pool = fakes.pool()
    running = await pool.chat("resident", REQUEST)
    swap = asyncio.create_task(pool.chat("wanted", REQUEST))
    await until(lambda: resident.state is SlotState.UNLOADING, "the busy resident to drain")
    step.set()
    result = await collect(running)  # its running request finished whole
    assert result.text.split() == ["one", "two", "three"]
    await collect(await swap)
    assert (resident.state, wanted.state) == (SlotState.UNLOADED, SlotState.READY)
