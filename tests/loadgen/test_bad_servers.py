"""A refusing, closing, silent, trickling or garbled server: every request is counted as an
error of its kind, within the timeout, never a hang and never an exception out of the run."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from modelpool.loadgen import Kind, LoadPlan, LoadSpec, run_sweep
from modelpool.loadgen.report import notes

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> None:
    await read_body(reader)


async def read_body(reader: asyncio.StreamReader) -> bytes:
    """One request off the connection; its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return await reader.readexactly(length)


def replying(raw: bytes, *, then_close: bool = True) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                writer.write(raw)
                await writer.drain()
                if then_close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return handle


async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(3600)  # cancelled when the server closes


async def trickling(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Headers, then a byte every 50 ms forever: each read is quick, the whole is endless."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    while True:
        writer.write(b"1\r\n:\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)


def http(status: str, content_type: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


@asynccontextmanager
async def stub(handler: Handler) -> AsyncIterator[str]:
    """A raw HTTP server on a free loopback port; its connections are cut when the block ends
    (Python 3.11's server has no close_clients, so the handlers are tracked here)."""
    handlers: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CASES: dict[str, tuple[Handler, Kind]] = {
    "http_401": (replying(http("401 Unauthorized", "application/json", b'{"error":{"message":"bad key"}}')), "chat"),
    "closed": (closing, "chat"),
    "timeout": (silent, "chat"),
    "non_json": (replying(http("200 OK", "application/json", b"<html>not json</html>")), "embeddings"),
    "incomplete": (
        replying(http("200 OK", "text/event-stream", b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n')),
        "chat",
    ),
}


@pytest.mark.parametrize("kind", sorted(CASES))
async def test_each_failure_is_counted_by_kind(kind):
    handler, request_kind = CASES[kind]
    async with stub(handler) as url:
        spec = LoadSpec(url, "m", kind=request_kind, timeout_s=0.5)
        warmup, runs = await run_sweep(spec, LoadPlan(concurrency=(1, 3), requests=3, warmup=1))
    assert [r.error for r in warmup] == [kind]
    for run in runs:
        assert run.summary.errors == {kind: 3}
        assert run.summary.succeeded == 0
        assert len(run.records) == 3


async def test_a_garbled_stream_event_is_non_json():
    body = b"data: {oops\n\ndata: [DONE]\n\n"
    async with stub(replying(http("200 OK", "text/event-stream", body))) as url:
        _, runs = await run_sweep(LoadSpec(url, "m", timeout_s=2), LoadPlan(requests=2, warmup=0))
    assert runs[0].summary.errors == {"non_json": 2}


async def test_a_refused_connection_is_counted():
    spec = LoadSpec(f"http://127.0.0.1:{closed_port()}", "m", timeout_s=2)
    _, runs = await run_sweep(spec, LoadPlan(requests=4, concurrency=(2,), warmup=0))
    assert runs[0].summary.errors == {"connect": 4}


async def test_a_trickling_server_is_cut_off_by_the_whole_request_timeout():
    async with stub(trickling) as url:
        began = time.monotonic()
        _, runs = await run_sweep(LoadSpec(url, "m", timeout_s=0.5), LoadPlan(requests=2, concurrency=(2,), warmup=0))
    assert runs[0].summary.errors == {"timeout": 2}
    assert time.monotonic() - began < 10  # bounded by the timeout, not by the server


async def test_a_duration_level_stops_starting_requests_at_its_end():
    async with stub(replying(http("503 Service Unavailable", "application/json", b"{}"), then_close=False)) as url:
        _, runs = await run_sweep(LoadSpec(url, "m"), LoadPlan(requests=None, duration_s=0.3, warmup=0))
    (run,) = runs
    assert run.records and set(run.summary.errors) == {"http_503"}
    assert all(r.started_s < 0.3 for r in run.records)
    assert [r.index for r in run.records] == list(range(len(run.records)))


STREAM = http("200 OK", "text/event-stream", b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n')


def closing_kept_alive(answered: int) -> tuple[Handler, list[int]]:
    """llama-server's way (cpp-httplib): a reply whose headers keep the connection alive, then
    the connection closed. Made deterministic here: the connection stays open until the next
    request arrives on it, which is then dropped unanswered. Only the first `answered`
    connections get their first request answered; the list counts connections."""
    opened: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(1)
        await read_request(reader)
        if len(opened) <= answered:
            writer.write(STREAM.replace(b"\r\n\r\n", b"\r\nkeep-alive: timeout=5, max=100\r\n\r\n", 1))
            await writer.drain()
            await read_request(reader)  # the client reused the connection: drop it, no reply

    return handle, opened


async def test_a_kept_alive_connection_closed_by_the_server_is_resent_once_on_a_fresh_one():
    handler, opened = closing_kept_alive(answered=1_000)
    async with stub(handler) as url:
        _, runs = await run_sweep(LoadSpec(url, "m", timeout_s=5), LoadPlan(requests=4, concurrency=(1,), warmup=0))
    (run,) = runs
    assert run.summary.errors == {} and run.summary.succeeded == 4
    assert [r.resent for r in run.records] == [0, 1, 1, 1]  # the first went out on a fresh connection
    assert run.summary.resent == 3 and len(opened) == 4
    assert any("sent again on a fresh connection" in note for note in notes(LoadSpec(url, "m"), runs))


async def test_a_resent_request_that_fails_again_is_counted_not_resent_twice():
    handler, opened = closing_kept_alive(answered=1)  # later connections close unanswered
    async with stub(handler) as url:
        _, runs = await run_sweep(LoadSpec(url, "m", timeout_s=5), LoadPlan(requests=3, concurrency=(1,), warmup=0))
    (run,) = runs
    assert [(r.error, r.resent) for r in run.records] == [(None, 0), ("closed", 1), ("closed", 0)]
    assert len(opened) == 3  # the 2nd: its own and its resend; the 3rd failed on a fresh one, not resent
