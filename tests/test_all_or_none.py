"""`all_or_none`: the parts of one batch (a /generate request's generations, a request's
images, its schema checks) stand or fall together: a failure, or the caller leaving,
stops every sibling before anything is raised."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from modelpool.errors import InvalidRequest
from modelpool.offload import all_or_none


async def call(start: Callable[[], Awaitable[Any]]) -> Any:
    return await start()


async def test_results_come_in_order() -> None:
    async def part(value: int) -> int:
        await asyncio.sleep(0.001 * (3 - value))
        return value

    assert await all_or_none(range(3), part) == [0, 1, 2]
    assert await all_or_none([], part) == []


async def test_the_first_failure_stops_every_sibling_before_it_is_raised() -> None:
    started = asyncio.Event()
    stopped: list[int] = []

    async def long(index: int) -> int:
        try:
            started.set()
            await asyncio.Event().wait()  # would run for ever
        finally:
            stopped.append(index)
        return index

    async def bad() -> int:
        await started.wait()
        raise InvalidRequest("token id out of range", param="prompts[2]")

    with pytest.raises(InvalidRequest) as caught:
        await all_or_none([lambda: long(0), lambda: long(1), bad, lambda: long(3)], call)
    assert caught.value.param == "prompts[2]"  # the failure itself, not an ExceptionGroup
    assert sorted(stopped) == [0, 1, 3]  # all stopped by the time it was raised


async def test_cancelling_the_caller_stops_every_part() -> None:
    running = 0
    all_started = asyncio.Event()

    async def long() -> None:
        nonlocal running
        running += 1
        if running == 3:
            all_started.set()
        try:
            await asyncio.Event().wait()
        finally:
            running -= 1

    caller = asyncio.create_task(all_or_none([long, long, long], call))
    await asyncio.wait_for(all_started.wait(), 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert running == 0


async def test_a_sibling_that_fails_while_stopping_does_not_replace_the_first_error() -> None:
    started = asyncio.Event()

    async def fails_on_cancel() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("closing failed") from None

    async def bad() -> None:
        await started.wait()
        raise InvalidRequest("bad prompt", param="prompts[1]")

    with pytest.raises(InvalidRequest):
        await all_or_none([fails_on_cancel, bad], call)
