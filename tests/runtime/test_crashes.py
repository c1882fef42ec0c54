"""A replica's engine process crashing: failed at once, restarted by the next request after a
doubling backoff, given up on after `max_restarts` in a row, forgiven by an explicit load."""

from __future__ import annotations

import pytest

from modelpool.backends.base import ChatBackend
from modelpool.errors import ModelLoadFailed
from modelpool.runtime.crashes import STABLE_RUN_S
from modelpool.runtime.lifecycle import SlotState
from tests.fakes import FakeProcessBackend, ManualClock, fake_slot


def delay(slot, clock: ManualClock) -> float:
    return slot.crashes.restart_delay(slot.config, clock.now - slot.record.failed_at, slot.record.error)


async def crash_once(slot, backend: FakeProcessBackend) -> None:
    (await slot.lease(ChatBackend, None)).release()
    backend.crash()
    assert slot.state is SlotState.FAILED


async def test_a_crash_fails_the_model_keeps_its_output_and_the_next_request_restarts_it() -> None:
    clock = ManualClock()
    backend = FakeProcessBackend()
    slot = fake_slot(backend, clock=clock, restart_backoff_s=2)
    await crash_once(slot, backend)
    assert "killed by signal 9" in (slot.record.error or "") and slot.crashes.in_a_row == 1
    assert slot.crashes.last_output == ["line 0 of pid 1001", "line 1 of pid 1001", "line 2 of pid 1001"]
    clock.advance(2)  # the backoff has passed: no waiting
    lease = await slot.lease(ChatBackend, None)
    assert slot.state is SlotState.READY and backend.starts == 2 and backend.pid == 1002
    assert lease.replica.memory_bytes == 4242  # the process's own memory, not our RSS growth
    lease.release()


async def test_crashes_in_a_row_back_off_then_stop_restarting_until_an_explicit_load() -> None:
    clock = ManualClock()
    backend = FakeProcessBackend()
    slot = fake_slot(backend, clock=clock, restart_backoff_s=1, max_restarts=2)
    await crash_once(slot, backend)
    assert delay(slot, clock) == 1
    clock.advance(1)
    await crash_once(slot, backend)
    assert delay(slot, clock) == 2  # doubled
    clock.advance(2)
    await crash_once(slot, backend)
    with pytest.raises(ModelLoadFailed, match="crashed 3 times in a row"):
        await slot.lease(ChatBackend, None)
    assert backend.starts == 3
    slot.forgive_crashes()
    (await slot.lease(ChatBackend, None)).release()
    assert slot.state is SlotState.READY and backend.starts == 4


async def test_a_long_healthy_run_ends_the_row() -> None:
    clock = ManualClock()
    backend = FakeProcessBackend()
    slot = fake_slot(backend, clock=clock, restart_backoff_s=0)
    await crash_once(slot, backend)
    (await slot.lease(ChatBackend, None)).release()
    clock.advance(STABLE_RUN_S + 1)
    backend.crash()
    assert slot.crashes.in_a_row == 1


async def test_an_exit_after_unloading_is_not_a_crash() -> None:
    backend = FakeProcessBackend()
    slot = fake_slot(backend)
    (await slot.lease(ChatBackend, None)).release()
    await slot.unload()
    backend.crash()  # a late exit notice from the process that was just stopped
    assert slot.state is SlotState.UNLOADED and slot.crashes.in_a_row == 0


async def test_shutdown_detaches_engines_instead_of_stopping_them() -> None:
    backend = FakeProcessBackend()
    slot = fake_slot(backend)
    (await slot.lease(ChatBackend, None)).release()
    slot.close()  # the server is shutting down
    await slot.unload()
    assert backend.detaches == 1 and backend.stops == 0  # a persistent engine may keep running
    assert slot.state is SlotState.UNLOADED
