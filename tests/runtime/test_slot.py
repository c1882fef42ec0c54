from __future__ import annotations

import asyncio

import pytest

from modelpool.errors import ModelLoadFailed, ModelNotReady
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.slot import SlotState
from tests.fakes import FakeBackend, fake_slot


async def test_concurrent_first_requests_share_one_load() -> None:
    gate = asyncio.Event()
    backend = FakeBackend(gate)
    slot = fake_slot(backend)
    waiters = [asyncio.create_task(slot.ensure_ready(None)) for _ in range(5)]
    await asyncio.sleep(0)  # let every waiter reach the load
    assert slot.state is SlotState.LOADING
    gate.set()
    results = await asyncio.gather(*waiters)
    assert all(r is backend for r in results)
    assert backend.starts == 1
    assert slot.state is SlotState.READY and slot.load_seconds is not None


async def test_waiting_past_the_limit_is_model_not_ready_and_the_load_goes_on() -> None:
    gate = asyncio.Event()
    backend = FakeBackend(gate)
    slot = fake_slot(backend)
    with pytest.raises(ModelNotReady) as caught:
        await slot.ensure_ready(0)
    assert caught.value.status_code == 503 and "Retry-After" in caught.value.headers
    gate.set()
    assert await slot.ensure_ready(None) is backend
    assert backend.starts == 1


async def test_failed_load_is_kept_with_its_reason_and_not_retried_per_request() -> None:
    backend = FakeBackend(fail_with=RuntimeError("weights are corrupt"))
    slot = fake_slot(backend)
    for _ in range(3):
        with pytest.raises(ModelLoadFailed, match="weights are corrupt"):
            await slot.ensure_ready(None)
    assert slot.state is SlotState.FAILED and slot.failed_at is not None
    assert backend.starts == 1 and backend.stops == 1  # stop() cleans up after a failed start


async def test_unload_stops_the_backend_and_the_next_request_loads_again() -> None:
    backend = FakeBackend()
    slot = fake_slot(backend)
    await slot.ensure_ready(None)
    await slot.unload()
    assert slot.state is SlotState.UNLOADED and backend.stops == 1
    await slot.ensure_ready(None)
    assert backend.starts == 2


async def test_state_gauge_follows_the_slot() -> None:
    metrics = Metrics()
    slot = fake_slot(FakeBackend(), metrics=metrics)

    def gauge(state: str) -> float:
        return metrics.registry.get_sample_value("modelpool_model_state", {"model": "fake", "state": state})

    assert gauge("unloaded") == 1 and gauge("ready") == 0
    await slot.ensure_ready(None)
    assert gauge("unloaded") == 0 and gauge("ready") == 1


async def test_acquire_gives_one_turn_at_a_time() -> None:
    slot = fake_slot(FakeBackend(), max_concurrency=1)
    _, release = await slot.acquire(None)
    second = asyncio.create_task(slot.acquire(None))
    await asyncio.sleep(0)
    assert not second.done()
    release()
    _, release_second = await second
    release_second()
