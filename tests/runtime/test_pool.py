from __future__ import annotations

import asyncio

import numpy as np
import pytest

from modelpool.backends.base import MemoryEstimate
from modelpool.errors import (
    InsufficientCapacity,
    InvalidRequest,
    ModelNotFound,
    ModelUnloaded,
    ShuttingDown,
    UnsupportedTask,
)
from modelpool.inference import ChatMessage, ChatRequest, EmbeddingRequest
from modelpool.pool_api.generation import collect
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.tasks import Task
from tests.fakes import FakeBackend, FakePool, ManualClock, fake_slot, pool_of

REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


async def test_names_aliases_and_tasks() -> None:
    slot = fake_slot(FakeBackend(), "m1", aliases=["alias-1"], tasks=frozenset({Task.CHAT}))
    pool = pool_of(slot)
    assert pool.slot("alias-1") is slot
    with pytest.raises(ModelNotFound, match="Known models: m1"):
        pool.slot("m2")
    with pytest.raises(UnsupportedTask, match="does not do embedding"):
        await pool.embed("m1", EmbeddingRequest(("x",)))
    assert pool.metrics_label("alias-1") == "m1" and pool.metrics_label("zzz") == "unknown"


async def test_generation_is_assembled_and_counted() -> None:
    metrics = Metrics()
    pool = pool_of(fake_slot(FakeBackend(), metrics=metrics))
    generation = await collect(await pool.chat("fake", REQUEST))
    assert generation.text == "one two three " and generation.finish_reason == "stop"
    assert metrics.registry.get_sample_value("modelpool_output_tokens_total", {"model": "fake"}) == 3


async def test_a_stream_closed_before_iteration_gives_its_turn_back() -> None:
    pool = pool_of(fake_slot(FakeBackend(), max_concurrency=1))
    abandoned = await pool.chat("fake", REQUEST)
    await abandoned.aclose()
    await abandoned.aclose()  # idempotent
    again = await asyncio.wait_for(pool.chat("fake", REQUEST), timeout=5)
    assert (await collect(again)).text == "one two three "


async def test_readiness_counts_only_preloaded_models() -> None:
    gate = asyncio.Event()
    eager = fake_slot(FakeBackend(gate), "eager")
    lazy = fake_slot(FakeBackend(), "lazy", preload=False)
    pool = pool_of(eager, lazy)
    preload = asyncio.create_task(pool.preload())
    for _ in range(5):  # a few loop turns: the preload task starts each slot's load
        await asyncio.sleep(0)
    assert pool.readiness() == (False, {"eager": "loading", "lazy": "unloaded"})
    gate.set()
    await preload
    assert pool.readiness() == (True, {"eager": "ready", "lazy": "unloaded"})


async def test_closed_pool_refuses_work() -> None:
    pool = pool_of(fake_slot(FakeBackend()))
    await pool.close()
    with pytest.raises(ShuttingDown):
        await pool.chat("fake", REQUEST)


async def test_loading_past_the_budget_evicts_the_least_recently_used_idle_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A load's measured RSS growth counts instead of its estimate when above 0: a page the
    # allocator touches meanwhile (8 KiB) would outweigh these 400-byte models.
    monkeypatch.setattr("modelpool.runtime.memory_accounts.process_rss", lambda: 0)
    fakes = FakePool(memory_bytes=1000)
    clock = fakes.clock
    old, recent, new = (FakeBackend(memory=400) for _ in range(3))
    for backend, name in ((old, "old"), (recent, "recent"), (new, "new")):
        fakes.slot(backend, name)
    pool = fakes.pool()
    await collect(await pool.chat("old", REQUEST))
    clock.advance(10)
    await collect(await pool.chat("recent", REQUEST))
    clock.advance(10)
    await collect(await pool.chat("new", REQUEST))
    states = {s.id: s.state for s in pool.slots()}
    assert states == {"old": SlotState.UNLOADED, "recent": SlotState.READY, "new": SlotState.READY}
    assert old.stops == 1 and recent.stops == 0


class _GrowingFake(FakeBackend):
    """A model whose load grows RSS by `memory` and which may grow by `growth` more under load."""

    def __init__(self, rss: list[int], memory: int, growth: int) -> None:
        super().__init__(memory=memory)
        self.rss, self.growth = rss, growth

    async def start(self) -> None:
        await super().start()
        self.rss[0] += self.memory

    def growth_bound(self) -> MemoryEstimate:
        return MemoryEstimate(self.growth)


async def test_a_model_that_grows_under_load_is_counted_at_its_bound_from_its_load_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A KV cache that grows with the batch is empty when the load is measured: the model is
    counted at the load's growth plus its growth bound, so the next load evicts it (300 +
    500 measured and bound, + 400 > 1000) where the load's growth alone would let both stay."""
    rss = [0]
    monkeypatch.setattr("modelpool.runtime.memory_accounts.process_rss", lambda: rss[0])
    fakes = FakePool(memory_bytes=1000)
    growing = _GrowingFake(rss, memory=300, growth=500)
    fakes.slot(growing, "growing")
    fakes.slot(_GrowingFake(rss, memory=400, growth=0), "plain")
    pool = fakes.pool()
    await collect(await pool.chat("growing", REQUEST))
    assert pool.slot("growing").memory_bytes() == 800
    assert pool.slot("growing").replicas.measured_bytes() == 300  # measured stays what was measured
    fakes.clock.advance(10)
    await collect(await pool.chat("plain", REQUEST))
    states = {s.id: s.state for s in pool.slots()}
    assert states == {"growing": SlotState.UNLOADED, "plain": SlotState.READY}
    assert growing.stops == 1


async def test_when_nothing_can_go_the_load_is_refused_with_what_is_loaded() -> None:
    fakes = FakePool(memory_bytes=1000)
    step = asyncio.Event()
    busy = fakes.slot(FakeBackend(memory=600, step=step), "busy")
    pinned = fakes.slot(FakeBackend(memory=300), "pinned", pinned=True)
    fakes.slot(FakeBackend(memory=800), "wanted")  # more than the pinned model leaves: no wait helps
    pool = fakes.pool()
    await collect(await pool.chat("pinned", REQUEST))
    running = await pool.chat("busy", REQUEST)  # holds its turn: not evictable
    with pytest.raises(InsufficientCapacity) as caught:
        await pool.chat("wanted", REQUEST)
    message = caught.value.message
    assert caught.value.status_code == 503
    assert "cannot load model 'wanted'" in message and "busy (" in message and "pinned" in message
    assert busy.state is SlotState.READY and pinned.state is SlotState.READY  # nothing was thrown out
    step.set()
    await collect(running)


async def test_idle_models_are_reaped_by_the_clock() -> None:
    clock = ManualClock()
    slot = fake_slot(FakeBackend(), clock=clock, keep_alive=60)
    pool = pool_of(slot)
    await collect(await pool.chat("fake", REQUEST))
    assert await pool.reap_idle() == []
    clock.advance(61)
    assert await pool.reap_idle() == ["fake"]
    assert slot.state is SlotState.UNLOADED


async def test_forced_unload_cuts_a_running_generation() -> None:
    step = asyncio.Event()
    pool = pool_of(fake_slot(FakeBackend(step=step)))
    stream = await pool.chat("fake", REQUEST)
    unloading = asyncio.create_task(pool.unload("fake", drain=False))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not unloading.done()  # it waits for the revoked request to let go
    step.set()
    with pytest.raises(ModelUnloaded):
        await collect(stream)
    await unloading
    assert pool.slot("fake").state is SlotState.UNLOADED


async def test_embeddings_go_through_the_batcher_and_the_cache() -> None:
    backend = FakeBackend()
    slot = fake_slot(backend, tasks=frozenset({Task.EMBEDDING}), embedding_cache_size=10)
    pool = pool_of(slot)
    done = await pool.embed("fake", EmbeddingRequest(("ab", "abcd")))
    first, timing = done.value, done.timing
    np.testing.assert_array_equal(first.vectors[:, 0], [2, 4])
    again = (await pool.embed("fake", EmbeddingRequest(("abcd", "xyz")))).value
    np.testing.assert_array_equal(again.vectors[:, 0], [4, 3])
    assert backend.embed_calls == [2, 1]  # "abcd" came from the cache
    assert again.prompt_tokens == 2 and timing.backend_s >= 0


async def test_admin_load_validates_overrides_and_replicas() -> None:
    slot = fake_slot(FakeBackend(), replica_max=2)
    pool = pool_of(slot)
    with pytest.raises(InvalidRequest) as caught:
        await pool.load("fake", replicas=5)
    assert caught.value.param == "replicas"


async def test_gpu_budget_counts_estimated_gpu_memory() -> None:
    fakes = FakePool(gpu_bytes=1000)
    clock = fakes.clock

    class GpuBackend(FakeBackend):
        async def estimate_memory(self) -> MemoryEstimate:
            return MemoryEstimate(ram_bytes=10, gpu_bytes=700)

    first = fakes.slot(GpuBackend(), "first")
    second = fakes.slot(GpuBackend(), "second")
    pool = fakes.pool()
    await collect(await pool.chat("first", REQUEST))
    clock.advance(1)
    await collect(await pool.chat("second", REQUEST))
    assert (first.state, second.state) == (SlotState.UNLOADED, SlotState.READY)


async def test_an_unload_racing_a_first_request_leaves_a_consistent_state() -> None:
    gate = asyncio.Event()
    backend = FakeBackend(gate)
    pool = pool_of(fake_slot(backend))
    request = asyncio.create_task(pool.chat("fake", REQUEST))
    for _ in range(5):
        await asyncio.sleep(0)
    unload = asyncio.create_task(pool.unload("fake"))  # while the load is under way
    gate.set()
    stream = await request
    await collect(stream)
    await unload
    slot = pool.slot("fake")
    assert slot.state is SlotState.UNLOADED and len(slot.replicas) == 0
    assert backend.starts == backend.stops == 1  # nothing left running behind an "unloaded" state
