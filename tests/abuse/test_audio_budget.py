"""Many uploads of long (compressible) audio at once cannot hold more decoded samples than
`server.audio_budget_seconds`: each holds its share until its transcript closes, and one
that finds the budget spent waits `model_wait_s`, then gets 429 — before it decodes."""

from __future__ import annotations

import asyncio

import pytest

from modelpool.errors import Overloaded
from modelpool.inference import TranscriptionRequest
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.tasks.audio_budget import AudioBudget
from tests.audio_files import silent_flac
from tests.conftest import STT_MODEL, serving


async def test_a_share_waits_for_room_and_is_refused_after_the_wait() -> None:
    budget = AudioBudget(total_s=10.0)
    first = await budget.take(6.0, wait_s=1.0)
    with pytest.raises(Overloaded):
        await budget.take(6.0, wait_s=0.2)
    waiting = asyncio.create_task(budget.take(6.0, wait_s=30.0))
    await asyncio.sleep(0)  # the waiter is parked on the budget
    assert not waiting.done()
    first()
    second = await asyncio.wait_for(waiting, 5)
    assert budget.held_s == 6.0
    second()
    second()  # releasing twice gives back once
    assert budget.held_s == 0.0


async def test_one_release_never_lets_two_waiters_share_the_same_room() -> None:
    budget = AudioBudget(total_s=4.0)
    first = await budget.take(4.0, wait_s=1.0)
    waiters = [asyncio.create_task(budget.take(2.5, wait_s=0.5)) for _ in range(2)]
    await asyncio.sleep(0)  # both parked on the budget
    first()
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    assert sum(isinstance(outcome, Overloaded) for outcome in outcomes) == 1
    assert budget.held_s == 2.5


async def test_transcriptions_holding_the_budget_refuse_the_next_upload_until_they_close() -> None:
    cli = {
        "enabled_models": [STT_MODEL],
        "server": {"max_audio_seconds": 60, "audio_budget_seconds": 100, "model_wait_s": 1},
    }
    async with serving(cli) as (app, _):
        pool: ModelPool = app.state.pool
        await pool.load(STT_MODEL)  # loaded first: the 1 s wait is for the budget, not the load
        upload = silent_flac(60, rate=16000)
        held = await pool.transcribe(STT_MODEL, upload, TranscriptionRequest())  # 60 s held, stream unread
        assert pool.audio_budget is not None and pool.audio_budget.held_s == pytest.approx(60, abs=0.5)
        with pytest.raises(Overloaded) as refused:
            await pool.transcribe(STT_MODEL, upload, TranscriptionRequest())
        assert "server.audio_budget_seconds" in refused.value.message
        await held.segments.aclose()
        assert pool.audio_budget.held_s == pytest.approx(0, abs=1e-6)
        again = await pool.transcribe(STT_MODEL, upload, TranscriptionRequest())
        await again.segments.aclose()
        assert pool.audio_budget.held_s == pytest.approx(0, abs=1e-6)
