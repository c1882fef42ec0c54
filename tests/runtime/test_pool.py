from __future__ import annotations

import asyncio

import pytest

from modelpool.backends.base import ChatMessage, ChatRequest, EmbeddingRequest
from modelpool.errors import ModelNotFound, ShuttingDown, UnsupportedTask
from modelpool.runtime.generation import collect
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.tasks import Task
from tests.fakes import FakeBackend, fake_slot

REQUEST = ChatRequest((ChatMessage("user", "one two three"),))


def pool_of(*slots, metrics: Metrics | None = None) -> ModelPool:
    return ModelPool(list(slots), metrics or slots[0]._metrics, model_wait_s=None)


async def test_names_aliases_and_tasks() -> None:
    slot = fake_slot(FakeBackend(), "m1", aliases=["alias-1"])
    slot.tasks = frozenset({Task.CHAT})
    pool = pool_of(slot)
    assert pool.slot("alias-1") is slot
    with pytest.raises(ModelNotFound, match="Known models: m1"):
        pool.slot("m2")
    with pytest.raises(UnsupportedTask, match="does not do embedding"):
        await pool.embed("m1", EmbeddingRequest(("x",)))
    assert pool.metrics_label("alias-1") == "m1" and pool.metrics_label("zzz") == "unknown"


async def test_generation_is_assembled_and_counted() -> None:
    metrics = Metrics()
    pool = pool_of(fake_slot(FakeBackend(), metrics=metrics), metrics=metrics)
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
