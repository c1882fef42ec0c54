"""The slot's state machine, with a fake backend gated by events and a hand-moved clock."""

from __future__ import annotations

import asyncio

import pytest

from modelpool.backends.base import ChatBackend
from modelpool.errors import ModelLoadFailed, ModelNotLoaded, ModelNotReady, ModelUnloaded
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.metrics.prometheus import Metrics
from tests.fakes import FakeBackend, ManualClock, fake_slot


async def settle() -> None:
    """A few event-loop turns, so tasks started just now reach their first await."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrent_first_requests_share_one_load() -> None:
    gate = asyncio.Event()
    backend = FakeBackend(gate)
    slot = fake_slot(backend, max_concurrency=5)
    waiters = [asyncio.create_task(slot.lease(ChatBackend, None)) for _ in range(5)]
    await settle()
    assert slot.state is SlotState.LOADING
    gate.set()
    leases = await asyncio.gather(*waiters)
    assert all(lease.backend is backend for lease in leases)
    assert backend.starts == 1
    assert slot.state is SlotState.READY and slot.record.load_seconds is not None
    for lease in leases:
        lease.release()


async def test_waiting_past_the_limit_is_model_not_ready_and_the_load_goes_on() -> None:
    gate = asyncio.Event()
    backend = FakeBackend(gate)
    slot = fake_slot(backend)
    with pytest.raises(ModelNotReady) as caught:
        await slot.lease(ChatBackend, 0)
    assert caught.value.status_code == 503 and "Retry-After" in caught.value.headers
    assert slot.admission.running == 0 and slot.admission.waiting == 0  # the ticket went back
    gate.set()
    await slot.ensure_ready(None)
    assert backend.starts == 1 and slot.state is SlotState.READY


async def test_failed_load_is_kept_then_retried_after_the_cooldown() -> None:
    clock = ManualClock()
    backend = FakeBackend(fail_with=RuntimeError("weights are corrupt"))
    slot = fake_slot(backend, clock=clock, retry_cooldown_s=30)
    with pytest.raises(ModelLoadFailed, match="weights are corrupt"):
        await slot.ensure_ready(None)
    for _ in range(3):  # within the cooldown: the error at once, no new load
        with pytest.raises(ModelLoadFailed, match="next try in 30s") as caught:
            await slot.ensure_ready(None)
        assert caught.value.headers["Retry-After"] == "30"
    assert slot.state is SlotState.FAILED and backend.starts == 1 and backend.stops == 1
    clock.advance(31)
    backend.fail_with = None
    await slot.ensure_ready(None)
    assert slot.state is SlotState.READY and backend.starts == 2
    assert slot.record.error == "weights are corrupt"  # kept as the last error, for the admin listing


async def test_autoload_off_refuses_until_loaded_explicitly() -> None:
    backend = FakeBackend()
    slot = fake_slot(backend, autoload=False)
    with pytest.raises(ModelNotLoaded) as caught:
        await slot.lease(ChatBackend, None)
    assert caught.value.status_code == 409 and backend.starts == 0
    await slot.ensure_ready(None, explicit=True)
    lease = await slot.lease(ChatBackend, None)
    lease.release()


async def test_unload_stops_the_backend_and_the_next_request_loads_again() -> None:
    backend = FakeBackend()
    slot = fake_slot(backend)
    await slot.ensure_ready(None)
    await slot.unload()
    assert slot.state is SlotState.UNLOADED and backend.stops == 1
    (await slot.lease(ChatBackend, None)).release()
    assert backend.starts == 2


async def test_keep_alive_sets_the_expiry_and_zero_unloads_after_the_request() -> None:
    clock = ManualClock()
    backend = FakeBackend()
    slot = fake_slot(backend, clock=clock, keep_alive="5m")
    lease = await slot.lease(ChatBackend, None)
    lease.release()
    assert slot.expires_at == clock.now + 300 and not slot.expired()
    clock.advance(301)
    assert slot.expired()
    lease = await slot.lease(ChatBackend, None, keep_alive=-1)  # a request may say: keep it forever
    lease.release()
    assert slot.expires_at is None
    lease = await slot.lease(ChatBackend, None, keep_alive=0)
    lease.release()
    await settle()
    assert slot.state is SlotState.UNLOADED and backend.stops == 1


async def test_drain_waits_for_running_work_and_force_cuts_it() -> None:
    slot = fake_slot(FakeBackend(), max_concurrency=2)
    lease = await slot.lease(ChatBackend, None)
    unloading = asyncio.create_task(slot.unload(drain=True))
    await settle()
    assert slot.state is SlotState.UNLOADING and not unloading.done()
    lease.release()
    await unloading
    assert slot.state is SlotState.UNLOADED

    lease = await slot.lease(ChatBackend, None)
    forced = asyncio.create_task(slot.unload(drain=False))
    await settle()
    assert lease.revoked  # the request's stream sees this at its next step and raises ModelUnloaded
    with pytest.raises(ModelUnloaded, match="model 'fake' was unloaded") as caught:
        lease.check_revoked()
    assert caught.value.status_code == 503
    assert not forced.done()  # still waiting for the cut-off request to give its turn back
    lease.release()
    await forced
    assert slot.state is SlotState.UNLOADED


async def test_replicas_share_work_least_busy_first() -> None:
    backends = [FakeBackend(), FakeBackend()]
    slot = fake_slot(backends, replicas=2, max_concurrency=1)
    first = await slot.lease(ChatBackend, None)
    second = await slot.lease(ChatBackend, None)
    assert {first.replica.index, second.replica.index} == {0, 1}
    assert first.backend is not second.backend
    third = asyncio.create_task(slot.lease(ChatBackend, None))  # both busy: waits in the shared queue
    await settle()
    assert not third.done() and slot.admission.waiting == 1
    second.release()
    lease = await third
    assert lease.replica is second.replica
    first.release()
    lease.release()


async def test_scale_up_and_down_while_loaded() -> None:
    backends = [FakeBackend(), FakeBackend(), FakeBackend()]
    slot = fake_slot(backends, replica_max=3, max_concurrency=1)
    await slot.ensure_ready(None)
    await slot.scale(3)
    assert len(slot.replicas) == 3 and slot.admission.turns == 3
    busy = await slot.lease(ChatBackend, None)
    await slot.scale(1)
    assert len(slot.replicas) == 1
    assert slot.replicas.members == [busy.replica]  # the idle replicas went; the busy one stayed
    assert backends[1].stops == 1 and backends[2].stops == 1 and backends[0].stops == 0
    busy.release()


async def test_state_gauge_follows_the_slot() -> None:
    metrics = Metrics()
    slot = fake_slot(FakeBackend(), metrics=metrics)

    def gauge(state: str) -> float | None:
        return metrics.registry.get_sample_value("modelpool_model_state", {"model": "fake", "state": state})

    assert gauge("unloaded") == 1 and gauge("ready") == 0
    await slot.ensure_ready(None)
    assert gauge("unloaded") == 0 and gauge("ready") == 1


async def test_warmup_runs_once_per_replica_when_configured() -> None:
    backend = FakeBackend()
    slot = fake_slot(backend, warmup=True)
    await slot.ensure_ready(None)
    assert backend.warmups == 1
