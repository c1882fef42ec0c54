from __future__ import annotations

import asyncio

import pytest

from modelpool.errors import Overloaded
from modelpool.runtime.admission import Admission


async def test_turns_then_fifo_queue_then_429_at_once() -> None:
    admission = Admission(turns=1, queue=2, model_id="m")
    running = admission.admit()
    second, third = admission.admit(), admission.admit()
    with pytest.raises(Overloaded) as caught:
        admission.admit()
    assert caught.value.status_code == 429 and "Retry-After" in caught.value.headers
    assert (admission.running, admission.waiting) == (1, 2)
    order: list[str] = []

    async def wait(ticket, name: str) -> None:
        await ticket.wait_turn()
        order.append(name)

    tasks = [asyncio.create_task(wait(third, "third")), asyncio.create_task(wait(second, "second"))]
    running.done()
    await asyncio.sleep(0)
    assert order == ["second"]  # FIFO: admission order, not the order of waiting
    second.done()
    await asyncio.gather(*tasks)
    assert order == ["second", "third"]
    third.done()
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_waiter_that_leaves_frees_its_place() -> None:
    admission = Admission(turns=1, queue=1, model_id="m")
    running = admission.admit()
    waiting = admission.admit()
    waiting.done()  # the client went away while queued
    assert admission.waiting == 0
    again = admission.admit()  # its place is free again
    running.done()
    await again.wait_turn()
    assert admission.running == 1
    again.done()
    running.done()  # a second done() changes nothing
    assert admission.running == 0


async def test_resize_hands_new_turns_to_waiters() -> None:
    admission = Admission(turns=1, queue=5, model_id="m")
    admission.admit()
    waiters = [admission.admit() for _ in range(2)]
    admission.resize(turns=3, queue=5)
    await asyncio.gather(*(w.wait_turn() for w in waiters))
    assert admission.running == 3 and admission.waiting == 0
