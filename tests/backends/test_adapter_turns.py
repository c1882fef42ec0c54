"""`AdapterTurns`: one adapter (or the base model) in the engine at a time, fair by arrival.
Each case is a script of arrivals and departures and who is inside after each step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from modelpool.backends.adapter_turns import AdapterTurns

BASE = None


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Script:
    """Requests by name; `arrive` starts one (it enters or waits), `finish` ends one inside."""

    def __init__(self) -> None:
        self.turns = AdapterTurns()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.inside: set[str] = set()
        self._done: dict[str, asyncio.Event] = {}

    async def arrive(self, name: str, key: str | None) -> None:
        self._done[name] = asyncio.Event()

        async def request() -> None:
            await self.turns.enter(key)
            self.inside.add(name)
            try:
                await self._done[name].wait()
            finally:
                self.inside.discard(name)
                self.turns.leave()

        self.tasks[name] = asyncio.create_task(request())
        await settle()

    async def finish(self, name: str) -> None:
        self._done[name].set()
        await settle()

    async def cancel(self, name: str) -> None:
        self.tasks[name].cancel()
        await settle()


async def test_requests_for_the_adapter_inside_join_it_and_another_waits_for_the_engine_to_drain() -> None:
    s = Script()
    await s.arrive("a1", "pirate")
    await s.arrive("a2", "pirate")
    assert s.inside == {"a1", "a2"}
    await s.arrive("b1", "poet")
    await s.arrive("base", BASE)
    assert s.inside == {"a1", "a2"} and s.turns.waiting() == ["poet", BASE]
    await s.finish("a1")
    assert s.inside == {"a2"}  # poet still waits: pirate has not drained
    await s.finish("a2")
    assert s.inside == {"b1"} and s.turns.current == "poet"
    await s.finish("b1")
    assert s.inside == {"base"} and s.turns.current is BASE
    await s.finish("base")
    assert s.turns.inside == 0 and s.turns.waiting() == []


async def test_once_another_adapter_waits_the_adapter_inside_takes_no_newcomers() -> None:
    """A busy adapter cannot hold the engine: a newcomer for it waits behind the waiter for
    another, and when the engine drains, every waiter for the head's adapter goes in together."""
    s = Script()
    await s.arrive("a1", "pirate")
    await s.arrive("b1", "poet")
    await s.arrive("a2", "pirate")  # would join a1 but for b1 waiting
    await s.arrive("b2", "poet")
    assert s.inside == {"a1"} and s.turns.waiting() == ["poet", "pirate", "poet"]
    await s.finish("a1")
    assert s.inside == {"b1", "b2"} and s.turns.waiting() == ["pirate"]
    await s.finish("b1")
    await s.finish("b2")
    assert s.inside == {"a2"}
    await s.finish("a2")


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_goes_in() -> None:
    s = Script()
    await s.arrive("a1", "pirate")
    await s.arrive("b1", "poet")
    await s.arrive("base", BASE)
    await s.cancel("b1")
    assert s.turns.waiting() == [BASE]
    await s.arrive("a2", "pirate")  # still behind the base's waiter
    assert s.inside == {"a1"}
    await s.finish("a1")
    assert s.inside == {"base"}
    await s.finish("base")
    assert s.inside == {"a2"}
    await s.finish("a2")
    assert s.turns.inside == 0


async def test_a_waiter_cancelled_as_it_was_let_in_gives_its_place_back() -> None:
    turns = AdapterTurns()
    await turns.enter("pirate")
    waiter = asyncio.create_task(turns.enter("poet"))
    await settle()
    turns.leave()  # lets the poet waiter in ...
    waiter.cancel()  # ... and it is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert turns.inside == 0 and turns.waiting() == []
    await asyncio.wait_for(turns.enter("pirate"), 1)  # the engine is free again


async def test_a_stream_holds_its_turn_until_it_is_closed() -> None:
    turns = AdapterTurns()
    produced: list[int] = []

    async def numbers() -> AsyncGenerator[int, None]:
        for n in range(100):
            produced.append(n)
            yield n

    stream = turns.stream("pirate", numbers)
    assert await stream.__anext__() == 0
    assert turns.inside == 1 and turns.current == "pirate"
    other = asyncio.create_task(turns.enter("poet"))
    await settle()
    assert not other.done()
    await stream.aclose()  # the client left after one chunk
    await asyncio.wait_for(other, 1)
    assert turns.current == "poet" and produced == [0]
