"""Connection-level abuse against the server as `modelpool serve` runs it (uvicorn with
`uvicorn_config`): headers trickled or never sent, bodies that stop, a flood of idle
connections, and a client claiming another address through X-Forwarded-For.

The app serves no models (these bounds sit below every route), so each server starts in
well under a second."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from modelpool.cli.serving import uvicorn_config
from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.polling import until

GENEROUS_S = 5.0
"""Bounds are a second; a closed connection must be seen well inside this on a busy machine."""


@dataclass
class Running:
    port: int
    server: uvicorn.Server

    def open_connections(self) -> int:
        return len(self.server.server_state.connections)


@contextlib.asynccontextmanager
async def bounded_server(auth: dict[str, Any] | None = None, **server: Any) -> AsyncIterator[Running]:
    """A modelpool server with no models, with `server` settings, on a free loopback port."""
    cli = {"starter_models": False, "server": server, "auth": auth or {}}
    config = load_config(None, cli=cli, environ={})
    settings = uvicorn_config(create_app(config), config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    runner = uvicorn.Server(settings)
    task = asyncio.create_task(runner.serve(sockets=[sock]))
    try:
        await until(lambda: runner.started or task.done(), "uvicorn to start", timeout_s=60)
        if task.done():
            task.result()
        yield Running(sock.getsockname()[1], runner)
    finally:
        runner.should_exit = True
        await task
        sock.close()


async def seconds_until_closed(reader: asyncio.StreamReader) -> float:
    """How long until the server closes the connection (what it sent before is dropped)."""
    started = time.monotonic()
    while await asyncio.wait_for(reader.read(65536), GENEROUS_S * 4):
        pass
    return time.monotonic() - started


async def test_a_connection_trickling_its_headers_is_closed_after_the_header_timeout() -> None:
    async with bounded_server(header_timeout_s=1.0) as running:
        port = running.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        await writer.drain()
        assert await seconds_until_closed(reader) < GENEROUS_S
        writer.close()


async def test_a_connection_that_never_sends_is_closed_after_the_header_timeout() -> None:
    async with bounded_server(header_timeout_s=1.0) as running:
        port = running.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await seconds_until_closed(reader) < GENEROUS_S
        writer.close()


async def test_requests_whose_headers_arrived_are_not_cut_by_the_header_timeout() -> None:
    """A body that takes longer than the header timeout (but keeps coming) is served, and a
    kept-alive connection serves a second request after the first."""
    async with bounded_server(header_timeout_s=1.0, body_timeout_s=10.0) as running:
        port = running.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"model": "no-such-model", "input": "hello"}).encode()
        writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for piece in (body[:10], body[10:20], body[20:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.6)  # the pacing under test: 1.8 s of body > the 1 s header bound
        status_line = await asyncio.wait_for(reader.readline(), GENEROUS_S)
        assert status_line.startswith(b"HTTP/1.1 404")
        writer.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/healthz")).status_code == 200  # the same kept-alive connection


async def test_a_body_that_stops_coming_gets_408() -> None:
    async with bounded_server(body_timeout_s=1.0) as running:
        port = running.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": "x", '
        )
        await writer.drain()
        started = time.monotonic()
        status_line = await asyncio.wait_for(reader.readline(), GENEROUS_S * 2)
        assert time.monotonic() - started < GENEROUS_S
        assert status_line.startswith(b"HTTP/1.1 408")
        _head, _, rest = (await asyncio.wait_for(reader.read(65536), GENEROUS_S)).partition(b"\r\n\r\n")
        assert json.loads(rest)["error"]["code"] == "request_timeout"
        writer.close()


async def test_connections_past_the_limit_are_closed_as_they_arrive() -> None:
    async with bounded_server(max_connections=4, header_timeout_s=60.0) as running:
        held = [await asyncio.open_connection("127.0.0.1", running.port) for _ in range(4)]
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        assert await seconds_until_closed(reader) < GENEROUS_S
        writer.close()
        for _, held_writer in held:
            held_writer.close()
        await until(lambda: running.open_connections() < 4, "the held connections to close")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.port}") as client:
            assert (await client.get("/healthz")).status_code == 200


async def _statuses_with_forged_addresses(port: int) -> list[int]:
    statuses = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for n in range(3):
            forged = {"X-Forwarded-For": f"203.0.113.{n + 1}"}
            response = await client.post("/v1/embeddings", json={"model": "x", "input": "a"}, headers=forged)
            statuses.append(response.status_code)
    return statuses


async def test_x_forwarded_for_does_not_buy_a_fresh_rate_limit_bucket() -> None:
    """Per-address limits (no keys): a client forging X-Forwarded-For is still one address,
    unless the operator named the proxy that sets the header."""
    auth = {"unauthenticated": {"requests_per_minute": 2}}
    async with bounded_server(auth) as running:
        assert await _statuses_with_forged_addresses(running.port) == [404, 404, 429]
    async with bounded_server(auth, forwarded_allow_ips=["127.0.0.1"]) as running:
        assert await _statuses_with_forged_addresses(running.port) == [404, 404, 404]
