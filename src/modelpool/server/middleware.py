"""Pure ASGI middleware (no BaseHTTPMiddleware: it breaks streaming and cancellation).

RequestContext: X-Request-ID in and out, one access-log line per request, request
metrics, and the last-resort 500 for bugs. BodyLimit: 413 before an oversized body is
read whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelpool.errors import RequestTimeout, ShuttingDown
from modelpool.logs import current_request_id
from modelpool.runtime.clock import within
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.server.asgi import header, route_template, send_json
from modelpool.wire.errors import shaped_error
from modelpool.wire.openai.errors import error_body, error_payload, internal_error_body

access_log = logging.getLogger("modelpool.access")
log = logging.getLogger("modelpool.api")
_REQUEST_ID_MAX = 128


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: Metrics, model_label: Callable[[str], str]) -> None:
        self.app = app
        self.metrics = metrics
        self.model_label = model_label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # 32 random hex digits, as uuid4().hex gives, at a sixth of its cost (no UUID object)
        request_id = _incoming_request_id(scope) or os.urandom(16).hex()
        token = current_request_id.set(request_id)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["received_at"] = time.monotonic()
        started = time.perf_counter()
        status = {"code": 500, "sent": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["sent"] = message["status"], True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error")
            if not status["sent"]:
                await send_json(send_with_id, 500, shaped_error(scope["path"], 500, internal_error_body(request_id)))
        except asyncio.CancelledError:
            # The server cut the request off (shutdown grace period over): say so in JSON.
            if not status["sent"]:
                with contextlib.suppress(Exception):
                    body = error_payload(ShuttingDown("the server is shutting down"))
                    await send_json(send_with_id, 503, shaped_error(scope["path"], 503, body))
            raise
        finally:
            self._record(scope, status["code"], time.perf_counter() - started, request_id)
            current_request_id.reset(token)

    def _record(self, scope: Scope, status: int, seconds: float, request_id: str) -> None:
        route = route_template(scope) or "unmatched"
        asked = scope.get("state", {}).get("model_id")
        model = self.model_label(asked) if isinstance(asked, str) else ""
        self.metrics.observe_request(model, route, status, seconds)
        if not access_log.isEnabledFor(logging.INFO):  # `--log-level warning`: not even the line's fields
            return
        access_log.info(
            "%s %s %s %.1fms",
            scope["method"],
            scope["path"],
            status,
            seconds * 1000,
            extra={
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
                "model": model or None,
                "request_id": request_id,
            },
        )


_UPLOAD_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
FILES_PATH = "/v1/files"
FORM_OVERHEAD = 64 * 1024
"""Room for a multipart form's boundaries and fields around an uploaded file."""


class BodyLimit:
    """413 before an oversized body is read whole (a declared length at once, a chunked
    body as its bytes pass the limit); 408 when a body stops coming for `body_timeout_s`
    (one slow client must not hold a request task for ever)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_upload_bytes: int, body_timeout_s: float, max_file_bytes: int = 0
    ) -> None:
        """`max_file_bytes`: the bound of a `/v1/files` upload (0: `max_bytes`, as any body)."""
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_file_bytes = max_file_bytes or max_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_upload_bytes if scope["path"].startswith(_UPLOAD_PATHS) else self.max_bytes
        if scope["path"] == FILES_PATH:
            limit = self.max_file_bytes
        declared = header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._reject(send, limit, scope["path"])
            return
        clock = _BodyClock(receive, send, self.body_timeout_s, scope["path"], limit)
        await self.app(scope, clock.receive, clock.send)

    async def _reject(self, send: Send, limit: int, path: str) -> None:
        await send_json(send, 413, shaped_error(path, 413, _too_large(limit)))


def _too_large(limit: int) -> dict[str, Any]:
    return error_body(f"Request body exceeds the limit of {limit} bytes.", "invalid_request_error", "request_too_large")


class _BodyClock:
    """Waits at most `timeout_s` for each piece of a request body still coming, and counts
    its bytes as the app reads them. When a piece is late the client gets 408 from here,
    and when the bytes pass `limit` (a body with no Content-Length: chunked) 413; either
    way the app is told the client left (a route parsing the body would otherwise turn the
    error into its own 400), and nothing past the limit was held. Once the body is whole,
    receive only waits for the client to leave, with no deadline."""

    def __init__(self, receive: Receive, send: Send, timeout_s: float, path: str, limit: int) -> None:
        self._receive, self._send = receive, send
        self.timeout_s, self.path, self.limit = timeout_s, path, limit
        self.body_done = self.started = self.answered = False
        self.size = 0

    async def receive(self) -> Message:
        if self.answered:
            return {"type": "http.disconnect"}
        if self.body_done:
            return await self._receive()
        try:
            message = await within(self._receive(), self.timeout_s)
        except asyncio.TimeoutError:
            await self._answer_timeout()
            return {"type": "http.disconnect"}
        self.body_done = message["type"] != "http.request" or not message.get("more_body", False)
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            await self._answer(413, _too_large(self.limit))
            return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.answered:  # the 408 went out: whatever the app says after it is dropped
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    async def _answer_timeout(self) -> None:
        error = RequestTimeout(f"the request body stopped coming for {self.timeout_s:g} s (server.body_timeout_s)")
        await self._answer(408, error_payload(error))

    async def _answer(self, status: int, body: dict[str, Any]) -> None:
        self.answered = True
        if not self.started:
            await send_json(self._send, status, shaped_error(self.path, status, body))


def _incoming_request_id(scope: Scope) -> str | None:
    value = header(scope, b"x-request-id")
    if value and len(value) <= _REQUEST_ID_MAX and value.isprintable():
        return value
    return None
