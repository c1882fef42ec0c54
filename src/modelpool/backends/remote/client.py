"""An HTTP client for one OpenAI-compatible upstream: JSON calls and server-sent-event
streams, retries on connection errors and 5xx (never on 4xx, never once a stream has
begun), and the upstream's errors turned into ours.

A pooled keep-alive connection can be closed by the server just as a request goes out on
it (its idle timeout ran out). That is no failure of the request: one sent on a reused
connection that broke at once (`STALE_WINDOW_S`, see `_send`) is sent once more, at once, on
a fresh connection, whatever the retry policy (an engine's has none). A managed engine's
client drops idle connections sooner than the engine drops its own (`ENGINE_KEEPALIVE_S`),
so that window is rare.

aiohttp rather than httpx: on this kind of hardware it costs ~0.15 ms a pooled request
against httpx's ~0.55 ms, and that overhead is added to every forwarded request.
The API key is only ever put in the Authorization header; it is never logged or shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp

from modelpool.errors import UpstreamError, UpstreamUnavailable

log = logging.getLogger("modelpool.upstream")
T = TypeVar("T")
Payload = Callable[[], dict[str, Any]]
"""The keyword arguments of a request's body, made anew for each try (a FormData is consumed)."""

ENGINE_KEEPALIVE_S = 1.5
"""How long a managed engine's client keeps an idle pooled connection. Below the 5 s after
which uvicorn (llama_cpp.server, vLLM) and cpp-httplib (llama-server) close theirs, with room
for aiohttp's cleanup, which closes an idle connection between 1 and 2 times this late (and
never hands out one idle for longer). aiohttp's default, 15 s, outlived the engines' own."""
REMOTE_KEEPALIVE_S = 15.0
"""aiohttp's default, for a remote upstream (a TLS handshake to a hosted API is worth keeping)."""

STALE_WINDOW_S = 0.05
"""How soon after a request went out on a reused connection its hang-up still proves the
connection stale (see `_send`)."""

_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
"""What a request meets on a connection the server has closed: it hangs up before the
answer, or the write fails ("Can not write request body", a reset)."""
_NOT_STALE = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""A new connection that could not be made: the server is not there (no second try)."""


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2
    """Further tries after the first, on connection errors and 5xx answers."""
    backoff_s: float = 0.5
    """Wait before the first retry; doubled before each next one."""


@dataclass(frozen=True)
class UpstreamTimeouts:
    connect_s: float = 10.0
    read_s: float = 600.0
    """Longest silence between two reads (a long generation is fine while tokens flow)."""


class _Retryable(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class UpstreamClient:
    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        api_key: str | None = None,
        retry: RetryPolicy = RetryPolicy(),
        timeouts: UpstreamTimeouts = UpstreamTimeouts(),
        max_connections: int = 64,
        keepalive_s: float = REMOTE_KEEPALIVE_S,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._retry = retry
        self._timeouts = timeouts
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        """For the second try of a request that met a stale pooled connection: a connection
        of its own, closed after the answer."""

    def __repr__(self) -> str:  # never the key
        return f"UpstreamClient({self.name!r}, {self.base_url!r})"

    async def open(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._timeouts.connect_s, sock_read=self._timeouts.read_s
            )
            reuse = aiohttp.TraceConfig()
            reuse.on_connection_reuseconn.append(_note_reuse)
            reuse.on_request_headers_sent.append(_note_sent)
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive_s)
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=connector, headers=self._headers, raise_for_status=False,
                trace_configs=[reuse],
            )  # fmt: skip
            self._fresh = aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(force_close=True), headers=self._headers,
                raise_for_status=False,
            )  # fmt: skip

    async def close(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    # ----- calls ---------------------------------------------------------------------

    async def get_json(self, path: str) -> Any:
        return await self._with_retries(lambda: self._call("GET", path, None))

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return await self._with_retries(lambda: self._call("POST", path, body))

    async def post_form(self, path: str, fields: dict[str, str], file: tuple[str, bytes, str]) -> Any:
        """A multipart upload (audio): `fields` plus one `file` as (filename, data, content type)."""

        def form() -> dict[str, Any]:  # a FormData is consumed by its request: one per try
            data = aiohttp.FormData()
            for key, value in fields.items():
                data.add_field(key, value)
            name, content, content_type = file
            data.add_field("file", content, filename=name, content_type=content_type)
            return {"data": data}

        return await self._with_retries(lambda: self._call("POST", path, None, form))

    async def stream_bytes(self, path: str, body: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        """A binary response body as it arrives (speech); the request happens before the first chunk."""
        response = await self._with_retries(lambda: self._open_stream(path, body))
        return self._chunks(response)

    async def stream_events(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The JSON payload of each server-sent event until `[DONE]`. The request (and its
        retries) happens before the first item, so 4xx answers raise before anything streams."""
        response = await self._with_retries(lambda: self._open_stream(path, body))
        return self._events(response)

    async def probe(self, path: str) -> None:
        """One GET with no retries; raises UpstreamUnavailable or UpstreamError."""
        try:
            await self._call("GET", path, None)
        except _Retryable as exc:
            raise self._unavailable(exc.error) from None

    # ----- internals -----------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise UpstreamUnavailable(f"upstream '{self.name}' is not open (the model is not loaded)")
        return self._session

    def _url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    async def _send(self, method: str, path: str, payload: Payload) -> aiohttp.ClientResponse:
        """The response, once its head has come. A request whose reused connection proved
        stale is sent once more on a fresh connection (see the module docstring); a new
        connection that broke is the server's answer, and is not.

        `session.request` returns only once the answer's head came, which for a non-streamed
        generation is after the whole generation: a hang-up seen there may be a server that
        took the request, worked, and died. Sending it again would run that work twice. So
        the hang-up proves the connection stale only if it came within `STALE_WINDOW_S` of
        the request going out (aiohttp's `on_request_headers_sent`, just before it writes
        the head and body in one go), or before that. A server closing an idle connection
        closed it before our request reached it, so its FIN comes back within one round
        trip of our write (well under a millisecond to an engine on loopback); one that read
        the request and began work dies later. A failed write of a long upload may also come
        later: it is not sent again (the safe side: an error, never work done twice)."""
        attempt = SimpleNamespace(reused=False, sent_at=None)
        url = self._url(path)
        try:
            return await self.session.request(method, url, trace_request_ctx=attempt, **payload())
        except _NOT_STALE:
            raise
        except _STALE as exc:
            if not attempt.reused or not _within_stale_window(attempt.sent_at):
                raise
            log.info(
                "pooled connection closed by the upstream; sending again on a fresh one",
                extra={"upstream": self.name, "error": _describe(exc)},
            )
        assert self._fresh is not None  # opened with the session
        return await self._fresh.request(method, url, **payload())

    async def _call(self, method: str, path: str, body: dict[str, Any] | None, form: Payload | None = None) -> Any:
        try:
            response = await self._send(method, path, form or (lambda: {"json": body}))
            async with response:
                if response.status >= 400:
                    raise await self._error(response)
                return await response.json(content_type=None)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise _Retryable(exc) from exc

    async def _open_stream(self, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        try:
            response = await self._send("POST", path, lambda: {"json": body})
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise _Retryable(exc) from exc
        if response.status >= 400:
            try:
                raise await self._error(response)
            finally:
                response.release()
        return response

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncGenerator[dict[str, Any], None]:
        try:
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # comments, `event:` lines, blank separators
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                payload = json.loads(data)
                if isinstance(payload, dict) and "error" in payload:
                    raise _error_from_payload(self.name, 502, payload)
                yield payload
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamUnavailable(f"upstream '{self.name}' went away mid-response ({_describe(exc)})") from None
        finally:
            response.close()  # an unfinished stream is abandoned: the upstream stops generating

    async def _chunks(self, response: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamUnavailable(f"upstream '{self.name}' went away mid-response ({_describe(exc)})") from None
        finally:
            response.close()

    async def _with_retries(self, attempt: Callable[[], Awaitable[T]]) -> T:
        delay = self._retry.backoff_s
        for tries_left in range(self._retry.retries, -1, -1):
            try:
                return await attempt()
            except _Retryable as exc:
                if tries_left == 0:
                    raise self._unavailable(exc.error) from None
                log.warning(
                    "upstream unreachable; retrying",
                    extra={"upstream": self.name, "error": _describe(exc.error), "retry_in_s": delay},
                )
            except UpstreamError as exc:
                if exc.upstream_status < 500 or tries_left == 0:
                    raise
                log.warning(
                    "upstream failed; retrying",
                    extra={"upstream": self.name, "status": exc.upstream_status, "retry_in_s": delay},
                )
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _unavailable(self, error: Exception) -> UpstreamUnavailable:
        return UpstreamUnavailable(f"upstream '{self.name}' at {self.base_url} is unreachable ({_describe(error)})")

    async def _error(self, response: aiohttp.ClientResponse) -> UpstreamError:
        text = await response.text(errors="replace")
        try:
            payload = json.loads(text)
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            return _error_from_payload(self.name, response.status, payload)
        return UpstreamError(response.status, f"upstream '{self.name}' answered {response.status}: {text[:500]}")


def _error_from_payload(name: str, status: int, payload: dict[str, Any]) -> UpstreamError:
    """OpenAI's `{"error": {...}}`, FastAPI's `{"detail": ...}`, or whatever JSON came."""
    error = payload.get("error")
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        code = error.get("code")
        return UpstreamError(
            status,
            f"upstream '{name}' answered {status}: {message}",
            error_type=str(error["type"]) if error.get("type") else None,
            code=str(code) if code else None,
        )
    detail = payload.get("detail", error if error is not None else payload)
    return UpstreamError(status, f"upstream '{name}' answered {status}: {json.dumps(detail)[:500]}")


async def _note_reuse(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceConnectionReuseconnParams
) -> None:
    """A request went out on a pooled connection: if it breaks before the answer, that
    connection was stale (the request's own `trace_request_ctx` is told)."""
    attempt = context.trace_request_ctx
    if isinstance(attempt, SimpleNamespace):
        attempt.reused = True


async def _note_sent(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestHeadersSentParams
) -> None:
    """The request is about to be written (its head and body follow without a wait)."""
    attempt = context.trace_request_ctx
    if isinstance(attempt, SimpleNamespace):
        attempt.sent_at = time.monotonic()


def _within_stale_window(sent_at: float | None) -> bool:
    """Broke before the request went out, or so soon after that the server cannot have taken it."""
    return sent_at is None or time.monotonic() - sent_at < STALE_WINDOW_S


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
