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


async def with_error_event(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Pass events through; a failure mid-stream becomes an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except ModelpoolError as exc:
        yield sse(error_payload(exc))
        yield DONE
    except Exception:
        log.exception("error while streaming")
        yield sse(internal_error_body(current_request_id.get()))
        yield DONE


class EventStreamResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            with_error_event(events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
