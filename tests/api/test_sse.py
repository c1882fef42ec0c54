"""Streamed responses always give their turn back: when the body ends, when the client
leaves, and when a send blocks past the send timeout (a client that stopped reading)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

from starlette.types import Message

from modelpool.api.sse import DEFAULT_SEND_TIMEOUT_S, EventStreamResponse, send_timeout
from modelpool.wire.sse import sse


def scope_with(timeout_s: float | None) -> dict[str, object]:
    state = (
        SimpleNamespace()
        if timeout_s is None
        else SimpleNamespace(config=SimpleNamespace(server=SimpleNamespace(stream_send_timeout_s=timeout_s)))
    )
    return {"type": "http", "asgi": {"spec_version": "2.3"}, "app": SimpleNamespace(state=state)}


async def never_disconnects() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_send_blocked_past_the_timeout_cuts_the_stream_and_closes_everything() -> None:
    closed: list[str] = []
    sent: list[Message] = []
    unblocked = asyncio.Event()  # never set: the client never reads again

    async def events() -> AsyncIterator[bytes]:
        try:
            for i in range(1000):
                yield sse({"n": i})
        finally:
            closed.append("events")

    async def blocking_send(message: Message) -> None:
        sent.append(message)
        if len(sent) > 2:  # the headers and a first event went out; then the buffers are full
            await unblocked.wait()

    async def on_close() -> None:
        closed.append("turn")

    response = EventStreamResponse(events(), on_close=on_close)
    await asyncio.wait_for(response(scope_with(0.05), never_disconnects, blocking_send), timeout=5)
    assert closed == ["events", "turn"]  # the generation stopped and the turn went back
    assert len(sent) == 3 and sent[-1].get("more_body") is True  # cut: no proper end was sent


async def test_a_stream_read_in_time_is_not_cut() -> None:
    sent: list[Message] = []

    async def events() -> AsyncIterator[bytes]:
        for i in range(3):
            yield sse({"n": i})

    async def slow_send(message: Message) -> None:
        await asyncio.sleep(0.01)  # slower than nothing, well within the timeout
        sent.append(message)

    async def on_close() -> None:
        return None

    await EventStreamResponse(events(), on_close=on_close)(scope_with(1.0), never_disconnects, slow_send)
    assert [m.get("more_body") for m in sent[1:]] == [True, True, True, False]


def test_the_timeout_comes_from_the_config_or_its_default() -> None:
    assert send_timeout(scope_with(2.5)) == 2.5
    assert send_timeout(scope_with(None)) == DEFAULT_SEND_TIMEOUT_S
