"""A client that stops reading a stream is cut after `server.stream_send_timeout_s`, so its
turn comes back: unread streams once held all of the starter model's turns for as long
as their generations ran, and nothing noticed that nobody read. Real sockets against a real
uvicorn server, with small socket buffers so the server's sends block quickly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import cast

import httpx
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from modelpool.config import load_config
from modelpool.server.app import create_app
from modelpool.server.http_protocol import bounded_protocol
from tests.conftest import CHAT_MODEL
from tests.polling import until

STREAMS = 16
"""The starter model's turns (llama.cpp's `parallel` default at its n_ctx 2048)."""
SMALL_BUFFER = 4096
STREAM = {
    "model": CHAT_MODEL,
    "messages": [{"role": "user", "content": "Write a very long story."}],
    "max_tokens": 2000,  # within the starter's 2048-token context
    "ignore_eos": True,  # as long as max_tokens on any machine
    "stream": True,
    "logprobs": True,
    "top_logprobs": 20,  # ~1 KB an event: the buffers fill after a few dozen tokens
}


class SmallBuffers(bounded_protocol(header_timeout_s=10, max_connections=1000)):  # type: ignore[misc]
    """The server's HTTP protocol with a small write buffer (64 KiB by default): its sends
    block after a few events a client has not taken, instead of a few dozen."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=SMALL_BUFFER)


def blocked_sends(server: uvicorn.Server) -> int:
    """Connections whose next send waits for the client to read (their buffers are full)."""
    # cast: this server's protocol is the bounded httptools one (uvicorn types it as any protocol).
    return sum(cast(HttpToolsProtocol, c).flow.write_paused for c in server.server_state.connections)


@contextlib.asynccontextmanager
async def served(send_timeout_s: float) -> AsyncIterator[tuple[FastAPI, str, uvicorn.Server]]:
    """The starter chat model behind uvicorn on 127.0.0.1, its sockets' buffers small."""
    config = load_config(
        None,
        cli={"enabled_models": [CHAT_MODEL], "server": {"stream_send_timeout_s": send_timeout_s}},
        environ={},
    )
    app = create_app(config)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)  # accepted sockets inherit it
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    settings = uvicorn.Config(app, http=SmallBuffers, log_config=None, access_log=False, timeout_graceful_shutdown=30)
    server = uvicorn.Server(settings)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await until(lambda: server.started or task.done(), "uvicorn to start", timeout_s=120)
        task.result() if task.done() else None  # start-up failed: raise why
        await app.state.pool.slot(CHAT_MODEL).ensure_ready(None)
        yield app, f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        await task
        listener.close()


@contextlib.contextmanager
def stalled_readers(url: str, count: int) -> Iterator[list[socket.socket]]:
    """`count` streamed chat requests whose clients never read a byte of the answer."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(STREAM).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
            sock.connect((host, int(port)))
            sock.sendall(request)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()  # a closed socket ends any send still blocked on it


def closed_by_server(sock: socket.socket, deadline_s: float) -> bool:
    """Read what the server sent until it closes the connection (EOF) or the deadline."""
    sock.settimeout(0.5)
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


async def test_streams_nobody_reads_are_cut_and_give_their_turns_back() -> None:
    async with served(send_timeout_s=1.0) as (app, url, server):
        slot = app.state.pool.slot(CHAT_MODEL)
        engine = slot.replicas.members[0].backend._engine
        assert slot.admission.turns == STREAMS
        with stalled_readers(url, STREAMS) as sockets:
            await until(lambda: slot.admission.running == STREAMS, "the unread streams to hold every turn")
            await until(lambda: blocked_sends(server) > 0, "a stream's buffers to fill", timeout_s=120)
            # Each stalled send is cut one timeout after its buffers filled (a few dozen tokens).
            await until(lambda: slot.admission.running == 0, "the stalled streams to be cut", timeout_s=120)
            await until(lambda: engine.in_flight == 0, "the cut generations to leave the engine")
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                short = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
                answer = await client.post("/v1/chat/completions", json=short)
            assert answer.status_code == 200 and time.monotonic() - started < 10
            # Dropped, not left to drain: the sockets are open and unread, yet the server holds none.
            await until(lambda: len(server.server_state.connections) == 0, "the cut connections to be dropped")
            closed = await asyncio.gather(*(asyncio.to_thread(closed_by_server, s, 30) for s in sockets))
            assert all(closed), "the server left a cut stream's connection open"


async def test_unload_without_drain_is_quick_with_stalled_readers() -> None:
    async with served(send_timeout_s=300) as (app, url, server):
        slot = app.state.pool.slot(CHAT_MODEL)
        with stalled_readers(url, STREAMS):
            await until(lambda: slot.admission.running == STREAMS, "the unread streams to hold every turn")
            await until(lambda: blocked_sends(server) == STREAMS, "every stream's sends to block", timeout_s=120)
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                unloaded = await client.post(f"/v1/admin/models/{CHAT_MODEL}/unload", json={"drain": False})
            elapsed = time.monotonic() - started
            print(f"unload with drain: false, {STREAMS} stalled readers: {elapsed:.2f} s")
            assert unloaded.status_code == 200, unloaded.text
            assert elapsed < 10, f"unload with drain: false took {elapsed:.2f} s with stalled readers (0.3 s before)"
            assert slot.state.value == "unloaded"
