"""Item 8 of issue 27: forwarding never fails a request because of a reused connection.

A pooled keep-alive connection that the engine closes just as a request goes out used to
fail that request with 502 (`ServerDisconnectedError`, "Can not write request body"): 2 of
272 streams through a managed llama-server. Here a real asyncio HTTP server closes a
kept-alive connection on purpose, and a managed engine takes 500 requests at 16 at once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from modelpool.backends.remote.client import ENGINE_KEEPALIVE_S, RetryPolicy, UpstreamClient
from modelpool.errors import UpstreamUnavailable
from tests.conftest import serving
from tests.e2e.test_managed_engines import ENGINE, engine_config
from tests.polling import until

OK_BODY = json.dumps({"ok": True}).encode()
Behaviour = Callable[["Connection", int], Awaitable[bool]]
"""(the connection, the request's number on it from 0) → keep the connection open."""


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: int = 0


@dataclass
class Server:
    """A bare HTTP/1.1 server on loopback whose answer to each request is scripted."""

    behaviour: Behaviour
    requests: list[int] = field(default_factory=list)
    """The number on its connection of every request received, in order."""
    closed_by_client: list[float] = field(default_factory=list)
    """When each connection saw its client hang up (monotonic seconds)."""
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(reader, writer)
        try:
            while await read_request(reader):
                self.requests.append(connection.requests)
                keep = await self.behaviour(connection, connection.requests)
                connection.requests += 1
                if not keep:
                    return
            self.closed_by_client.append(time.monotonic())
        except ConnectionError:
            pass
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (head and Content-Length body); False at the client's end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as end:
        if end.partial:
            raise
        return False
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return True


async def answer(connection: Connection, body: bytes = OK_BODY) -> None:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    connection.writer.write(head.encode() + body)
    await connection.writer.drain()


@asynccontextmanager
async def scripted(behaviour: Behaviour) -> AsyncIterator[Server]:
    server = Server(behaviour)

    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


@asynccontextmanager
async def engine_client(url: str) -> AsyncIterator[UpstreamClient]:
    """The client as a managed engine's: no retries of its own (RetryPolicy(retries=0)), the
    short keep-alive (the managed backends pass ENGINE_KEEPALIVE_S)."""
    client = UpstreamClient("engine", url, retry=RetryPolicy(retries=0), keepalive_s=ENGINE_KEEPALIVE_S)
    await client.open()
    try:
        yield client
    finally:
        await client.close()


async def closes_kept_alive(connection: Connection, number: int) -> bool:
    """The first request on a connection is answered; the next one finds it closed (the
    engine's keep-alive ran out as the request went out): not one byte comes back."""
    if number == 0:
        await answer(connection)
        return True
    return False


async def test_a_request_on_a_connection_the_server_closed_is_sent_again_on_a_fresh_one() -> None:
    async with scripted(closes_kept_alive) as server, engine_client(server.url) as client:
        assert await client.post_json("chat/completions", {"n": 1}) == {"ok": True}
        assert await client.post_json("chat/completions", {"n": 2}) == {"ok": True}  # was a 502
        assert await client.post_json("chat/completions", {"n": 3}) == {"ok": True}
        assert await client.post_json("chat/completions", {"n": 4}) == {"ok": True}
    # The 1st connection answered, then dropped the 2nd request, which went again on a
    # connection of its own; the 3rd opened a new pooled connection, which dropped the 4th,
    # sent again in turn. Each request was answered once.
    assert server.requests == [0, 1, 0, 0, 1, 0]


async def test_a_fresh_connection_dropped_before_any_byte_is_not_retried() -> None:
    async def drops_everything(connection: Connection, number: int) -> bool:
        return False  # the engine drops the request itself: sending it again would not help

    async with scripted(drops_everything) as server, engine_client(server.url) as client:
        with pytest.raises(UpstreamUnavailable, match="ServerDisconnectedError"):
            await client.post_json("chat/completions", {"n": 1})
    assert server.requests == [0]


async def test_an_answer_cut_after_its_first_bytes_is_not_sent_again() -> None:
    async def cuts_the_second_answer(connection: Connection, number: int) -> bool:
        if number == 0:
            await answer(connection)
            return True
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        event = b'data: {"choices": []}\n\n'
        connection.writer.write(head + f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await connection.writer.drain()
        return False  # gone mid-answer: the engine died while generating

    async with scripted(cuts_the_second_answer) as server, engine_client(server.url) as client:
        assert await client.post_json("completions", {"n": 1}) == {"ok": True}
        events = await client.stream_events("completions", {"n": 2, "stream": True})
        with pytest.raises(UpstreamUnavailable, match="went away mid-response"):
            async for _ in events:
                pass
    assert server.requests == [0, 1]  # the cut answer was not asked for again


async def test_a_request_taken_by_the_server_on_a_reused_connection_is_not_sent_again() -> None:
    """The engine read the whole request on a kept-alive connection, worked on it, and died
    without an answer: sending it again would run the generation twice."""
    worked = asyncio.Event()

    async def dies_while_working(connection: Connection, number: int) -> bool:
        if number == 0:
            await answer(connection)
            return True
        # The generation's time, not a wait for a state: it must outlast the client's 50 ms
        # window for resending a request a reused connection dropped at once.
        await asyncio.sleep(0.5)
        worked.set()
        return False

    async with scripted(dies_while_working) as server, engine_client(server.url) as client:
        assert await client.post_json("chat/completions", {"n": 1}) == {"ok": True}
        with pytest.raises(UpstreamUnavailable, match="ServerDisconnectedError"):
            await client.post_json("chat/completions", {"n": 2})
        assert worked.is_set()
    assert server.requests == [0, 1]  # asked once: no fresh connection took it again


async def test_a_remote_upstreams_idle_connection_outlives_an_engines_keep_alive() -> None:
    """A remote upstream (a hosted API over TLS) keeps aiohttp's 15 s: a 1.5 s idle gap
    costs no new connection (and handshake)."""

    async def keeps_alive(connection: Connection, number: int) -> bool:
        await answer(connection)
        return True

    async with scripted(keeps_alive) as server:
        client = UpstreamClient("remote", server.url, retry=RetryPolicy(retries=0))
        await client.open()
        try:
            await client.post_json("models", {})
            idle_until = time.monotonic() + 3 * ENGINE_KEEPALIVE_S  # past the engine client's close
            await until(lambda: time.monotonic() > idle_until, "the idle gap", timeout_s=10)
            assert server.closed_by_client == []
            await client.post_json("models", {})
        finally:
            await client.close()
    assert server.requests == [0, 1]  # the second request went on the same connection


async def test_an_idle_connection_is_closed_before_the_engines_keep_alive_runs_out() -> None:
    """uvicorn (llama_cpp.server, vLLM) and cpp-httplib (llama-server) close a connection
    idle for 5 s; closing ours first leaves no window where both sides think it is open."""

    async def keeps_alive(connection: Connection, number: int) -> bool:
        await answer(connection)
        return True

    async with scripted(keeps_alive) as server, engine_client(server.url) as client:
        await client.post_json("models", {})
        answered = time.monotonic()
        await until(lambda: bool(server.closed_by_client), "the client to close its idle connection", timeout_s=4.5)
    assert server.closed_by_client[0] - answered < 4.5


# ----- through a managed engine -------------------------------------------------------

REQUESTS, CONCURRENT = 500, 16


async def test_500_requests_at_16_concurrent_through_a_managed_engine_all_succeed(tmp_path: Path) -> None:
    config = engine_config(tmp_path)
    async with serving(config) as (_, client):
        assert (await client.post(f"/v1/admin/models/{ENGINE}/load")).status_code == 200
        failures: list[str] = []
        sent = iter(range(REQUESTS))

        async def worker() -> None:
            for number in sent:
                body = {"model": ENGINE, "messages": [{"role": "user", "content": f"Count to {number}."}],
                        "max_tokens": 2, "stream": number % 2 == 0}  # fmt: skip
                response = await client.post("/v1/chat/completions", json=body)
                text = response.text
                if response.status_code != 200 or '"error"' in text:
                    failures.append(f"{response.status_code}: {text[:300]}")

        began = time.monotonic()
        async with asyncio.timeout(600):
            await asyncio.gather(*(worker() for _ in range(CONCURRENT)))
        took = time.monotonic() - began
    print(f"{REQUESTS} requests at {CONCURRENT} concurrent in {took:.1f}s, {len(failures)} failed")
    assert failures == [], failures[:5]
