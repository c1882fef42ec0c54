"""uvicorn's HTTP protocol with the bounds nginx keeps and uvicorn does not: a connection
that has not finished sending a request's headers within `header_timeout_s` is closed
(uvicorn waits for ever, so a client sending one header byte a minute — or nothing at all
after connecting — holds a socket and a file descriptor for good), and connections beyond
`max_connections` are closed as they arrive, before the process runs out of descriptors.
A response the app ended without completing it (a stream cut because its client stopped
reading) drops the connection at once: a plain close would wait for the unread bytes to
drain, which a client that never reads never lets happen, so its socket would stay open.
And what a response writes in one pass of the event loop goes out in one write (headers and
body together), not one send per piece. Each request's scope carries a `Disconnect` under
`extensions[DISCONNECT]`, fired when the connection is lost, so a route can learn of its
client's leaving without a task of its own waiting on `receive()`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from modelpool.api.disconnect import attach, disconnect_of

log = logging.getLogger("modelpool.api")


def default_max_connections() -> int:
    """Three quarters of the process's open-file limit: the rest stays for model files,
    engine pipes and logs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, soft * 3 // 4) if soft != resource.RLIM_INFINITY else 65536


class _ConnectionTransport:
    """The connection's transport, with two changes.

    - Writes made in one pass of the event loop go out as one: uvicorn writes a response's
      headers and its body separately, and on a loopback or LAN socket each write is a send
      syscall and a TCP segment of its own (measured: a quarter of the event loop's CPU under
      32 clients of small embedding requests). The bytes wait at most until the loop's next
      turn (`call_soon`), so a stream's event is not held back.
    - `close()` during an unfinished response with unsent bytes aborts (drops them) instead of
      waiting for a reader who stopped reading.
    """

    def __init__(self, transport: asyncio.Transport, cycle: Callable[[], RequestResponseCycle | None]) -> None:
        self._transport = transport
        self._cycle = cycle
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._pending_bytes

    def close(self) -> None:
        self._flush()
        cycle = self._cycle()
        unfinished = cycle is not None and not cycle.response_complete
        if unfinished and self._transport.get_write_buffer_size() > 0:
            self._transport.abort()
        else:
            self._transport.close()

    def abort(self) -> None:
        self._pending, self._pending_bytes = [], 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def bounded_protocol(header_timeout_s: float, max_connections: int) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection (`uvicorn.Config(http=...)`)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            guarded = _ConnectionTransport(transport, lambda: self.cycle)
            super().connection_made(guarded)  # type: ignore[arg-type]
            if len(self.connections) > max_connections:
                log.warning("connection refused: %d open connections is the limit", max_connections)
                transport.close()
                return
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_arrived()
            super().connection_lost(exc)
            for cycle in (self.cycle, *(queued for queued, _ in self.pipeline)):
                disconnect = None if cycle is None or cycle.response_complete else disconnect_of(cycle.scope)
                if disconnect is not None:
                    disconnect.fire()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            attach(cast(dict[str, Any], self.scope))

        def on_headers_complete(self) -> None:
            self._headers_arrived()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            idle = self.cycle is None or self.cycle.response_complete  # no pipelined request started
            if idle and not self.transport.is_closing():
                self._await_headers()  # the next request on this connection has the same time

        def _await_headers(self) -> None:
            self._headers_arrived()
            self._header_deadline = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_arrived(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedHttpToolsProtocol
