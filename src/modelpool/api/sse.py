"""Server-sent events: encoding, the error-then-[DONE] rule, and a response that always
gives its model turn back, even when the client leaves before the first byte."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from modelpool.api.errors import error_payload, internal_error_body
from modelpool.errors import ModelpoolError
from modelpool.logs import current_request_id

log = logging.getLogger("modelpool.api")
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


ErrorEvents = Callable[[dict[str, Any]], list[bytes]]


def chat_error_events(payload: dict[str, Any]) -> list[bytes]:
    """Chat and completions streams: the error envelope as an event, then [DONE]."""
    return [sse(payload), DONE]


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


class ClosingStreamingResponse(StreamingResponse):
    """A streamed body whose `on_close` always runs: the model's turn goes back even when
    the client leaves before the first byte."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str, on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


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
