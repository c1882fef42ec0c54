"""The server's HTTP protocol sends what a response writes in one pass of the event loop as
one write (one send syscall, one TCP segment): uvicorn writes a response's headers and body
separately, which doubled the segments of every small response. Real uvicorn, real
sockets; the raw transport under the protocol records each write it is given."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive, Scope, Send

from modelpool.server.http_protocol import bounded_protocol
from tests.live_server import live_server
from tests.polling import until

PAUSE_S = 1.0
"""How long the streaming app waits between its two events."""


class Recording:
    """A transport that keeps what each write gave it and passes it on."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def recording_protocol(writes: list[bytes]) -> type[asyncio.Protocol]:
    class RecordingProtocol(bounded_protocol(header_timeout_s=10, max_connections=100)):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(Recording(transport, writes))

    return RecordingProtocol


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """`/plain`: one small JSON body; `/stream`: an event, a pause, another event."""
    assert scope["type"] == "http"
    if scope["path"] == "/plain":
        body = b'{"ok": true}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    await asyncio.sleep(PAUSE_S)
    await send({"type": "http.response.body", "body": b"data: second\n\n", "more_body": False})


@contextlib.asynccontextmanager
async def serving(writes: list[bytes]) -> AsyncIterator[int]:
    async with live_server(app, lifespan=False, http=recording_protocol(writes)) as url:
        yield int(url.rsplit(":", 1)[1])


async def exchange(port: int, request: bytes, until_bytes: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        received = b""
        while until_bytes not in received:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=30)
            if not chunk:
                break
            received += chunk
        return received
    finally:
        writer.close()


async def test_a_small_response_goes_out_in_one_write() -> None:
    writes: list[bytes] = []
    async with serving(writes) as port:
        for _ in range(3):  # keep-alive: each response on the connection is one write
            writes.clear()
            reply = await exchange(port, b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n", b'{"ok": true}')
            assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"ok": true}')
            await until(lambda: len(writes) >= 1, "the write", timeout_s=5)
            assert len(writes) == 1, writes
            assert writes[0] == reply


async def test_a_stream_event_is_not_held_back_until_the_next() -> None:
    writes: list[bytes] = []
    async with serving(writes) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            started = asyncio.get_running_loop().time()
            received = b""
            while b"data: first" not in received:
                received += await asyncio.wait_for(reader.read(65536), timeout=30)
            waited = asyncio.get_running_loop().time() - started
            assert b"second" not in received
            assert waited < PAUSE_S, f"the first event came after {waited:.2f} s, with the second"
            assert len(writes) == 1  # the headers and the first event went out together
            while b"0\r\n\r\n" not in received:
                received += await asyncio.wait_for(reader.read(65536), timeout=30)
            assert b"data: second" in received
        finally:
            writer.close()


async def test_a_response_before_a_close_is_sent_whole() -> None:
    """`Connection: close`: uvicorn closes the transport right after the last write, which
    must send what waits first."""
    writes: list[bytes] = []
    async with serving(writes) as port:
        reply = await exchange(port, b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"\x00never")
        assert reply.startswith(b"HTTP/1.1 200")
        assert reply.endswith(b'{"ok": true}')
