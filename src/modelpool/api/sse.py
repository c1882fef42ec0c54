"""Server-sent event streams: the error-then-[DONE] rule (the events themselves are
`wire.sse`'s), and a response that always gives its model turn back, even when the client
leaves before the first byte or stops reading: a send the client does not take within
`server.stream_send_timeout_s` cuts the stream (the connection closes), so a reader that
stalls cannot hold a turn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from modelpool.errors import ModelpoolError
from modelpool.logs import current_request_id
from modelpool.wire.openai.errors import error_payload, internal_error_body
from modelpool.wire.sse import chat_error_events

log = logging.getLogger("modelpool.api")
ErrorEvents = Callable[[dict[str, Any]], list[bytes]]


async def with_error_event(events: AsyncIterator[bytes], on_error: ErrorEvents) -> AsyncIterator[bytes]:
    """Pass events through; a failure mid-stream becomes the stream's error event(s)."""
    try:
        async for event in events:
            yield event
    except ModelpoolError as exc:
        for event in on_error(error_payload(exc)):
            yield event
    except Exception:
        log.exception("error while streaming")
        for event in on_error(internal_error_body(current_request_id.get())):
            yield event
    finally:
        await _aclose(events)  # a cut stream closes the events it was reading too


DEFAULT_SEND_TIMEOUT_S = 30.0
"""For an app without a config on its state (`server.stream_send_timeout_s`'s default)."""


class StalledReader(Exception):
    """The client took no data for the send timeout: its stream is cut."""


class ClosingStreamingResponse(StreamingResponse):
    """A streamed body whose `on_close` always runs: the model's turn goes back even when
    the client leaves before the first byte, or stops reading (a send that blocks past
    the send timeout ends the response; the server then closes the connection)."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str, on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self._body = body
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        timeout_s = send_timeout(scope)
        try:
            await super().__call__(scope, receive, _cut_when_stalled(send, timeout_s))
        except StalledReader:
            # Returning without the response's last message makes the server close the connection.
            log.warning("a client stopped reading its stream: cut", extra={"send_timeout_s": timeout_s})
        finally:
            try:
                await _aclose(self._body)
            finally:
                await self._on_close()


def send_timeout(scope: Scope) -> float:
    """`server.stream_send_timeout_s` of the app serving `scope`."""
    state = getattr(scope.get("app"), "state", None)
    config = getattr(state, "config", None)
    return float(config.server.stream_send_timeout_s) if config is not None else DEFAULT_SEND_TIMEOUT_S


def _cut_when_stalled(send: Send, timeout_s: float) -> Send:
    """`send`, raising StalledReader when one message waits longer than `timeout_s` for
    the client to take data (the server's send blocks while the socket's buffers are full)."""

    if _timeout is None:  # Python 3.10

        async def send_or_cut(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), timeout_s)
            except asyncio.TimeoutError:  # not the builtin TimeoutError on Python 3.10
                raise StalledReader(f"no data taken for {timeout_s} s") from None

        return send_or_cut
    timer = _timeout

    async def send_in_time(message: Message) -> None:
        try:
            async with timer(timeout_s):
                await send(message)
        except TimeoutError:
            raise StalledReader(f"no data taken for {timeout_s} s") from None

    return send_in_time


_timeout: Callable[[float], AbstractAsyncContextManager[None]] | None = getattr(asyncio, "timeout", None)
"""`asyncio.timeout` (Python 3.11+): a timer around each send. `wait_for` wraps every send in
a Task of its own (one per streamed token on 3.11) and cost the event loop ~1.7x as much
per send (2026-11-28, uvloop, 2 shared cores, ABBA)."""


async def _aclose(iterator: AsyncIterator[bytes]) -> None:
    close = getattr(iterator, "aclose", None)  # async generators have it; a plain iterator has nothing to close
    if close is not None:
        await close()


class EventStreamResponse(ClosingStreamingResponse):
    """Server-sent events; a failure mid-stream becomes the stream's error event(s)."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        on_error: ErrorEvents = chat_error_events,
    ) -> None:
        super().__init__(with_error_event(events, on_error), "text/event-stream", on_close)
        self.headers["X-Accel-Buffering"] = "no"
