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
    admission.resize(turns=3, queue=5, per_key=None, aging_s=30.0)
    await asyncio.gather(*(w.wait_turn() for w in waiters))
    assert admission.running == 3 and admission.waiting == 0


async def test_a_batch_takes_as_many_turns_as_it_runs_at_once() -> None:
    admission = Admission(turns=4, queue=8, model_id="m")
    batch = admission.admit(size=3)
    assert (admission.running, batch.turns) == (3, 3)
    single = admission.admit()
    assert admission.running == 4
    late = admission.admit()  # no turn left: it waits, although only two requests run
    assert admission.waiting == 1 and late.turns == 0
    batch.done()
    await late.wait_turn()
    assert admission.running == 2
    single.done()
    late.done()
    assert admission.running == 0


async def test_a_batch_bigger_than_the_model_takes_every_turn_and_waits_in_order() -> None:
    admission = Admission(turns=4, queue=8, model_id="m")
    first = admission.admit()
    batch = admission.admit(size=30)  # more than the turns: it gets all of them, once all are free
    after = admission.admit()  # behind the batch, although a turn is free now
    assert (admission.running, admission.waiting) == (1, 2)
    first.done()
    await batch.wait_turn()
    assert (admission.running, batch.turns, admission.waiting) == (4, 4, 1)
    batch.done()
    await after.wait_turn()
    assert admission.running == 1
    after.done()


async def test_a_waiting_batch_holds_one_place_and_all_its_turns_once_in() -> None:
    admission = Admission(turns=3, queue=2, model_id="m")
    running = admission.admit(size=3)
    batch = admission.admit(size=3)  # waits: every turn is taken
    admission.admit()
    with pytest.raises(Overloaded):
        admission.admit()  # two requests in line fill a queue of two, whatever their sizes
    running.done()
    await batch.wait_turn()
    assert (batch.turns, admission.running) == (3, 3)
