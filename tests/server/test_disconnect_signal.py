"""A route learns that its client left from the server's protocol (a callback in the request's
scope), not from a task of its own blocked on `receive()`: real uvicorn with modelpool's
protocol, real sockets. And where the server gives no such callback (another ASGI server, the
in-process test client), `unless_disconnected` still watches `receive()` as before."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import unless_disconnected
from modelpool.api.disconnect import Disconnect, disconnect_of
from modelpool.errors import ClientDisconnected
from modelpool.server.http_protocol import bounded_protocol
from tests.live_server import live_server
from tests.polling import until


def watching_app(seen: dict[str, Any]) -> FastAPI:
    """`/slow` waits for ever inside `unless_disconnected`; what happened is put in `seen`."""
    app = FastAPI()

    @app.post("/slow")
    async def slow(request: Request) -> JSONResponse:
        seen["signal"] = disconnect_of(request.scope)
        work = asyncio.Event()
        seen["work"] = work

        async def forever() -> None:
            work.set()
            await asyncio.Event().wait()

        try:
            await unless_disconnected(request, forever())
        except ClientDisconnected as exc:
            seen["outcome"] = f"disconnected: {exc}"
            raise
        except asyncio.CancelledError:
            seen["outcome"] = "cancelled"
            raise
        return JSONResponse({})

    return app


async def leave_midway(url: str, seen: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}")
    await writer.drain()
    await until(lambda: "work" in seen and seen["work"].is_set(), "the work to start", timeout_s=30)
    writer.close()
    await writer.wait_closed()
    await until(lambda: "outcome" in seen, "the route to see its client leave", timeout_s=30)
    del reader


async def test_the_protocol_fires_the_scope_callback_and_the_work_is_cancelled() -> None:
    seen: dict[str, Any] = {}
    protocol = bounded_protocol(header_timeout_s=10, max_connections=100)
    async with live_server(watching_app(seen), http=protocol) as url:
        await leave_midway(url, seen)
    signal = seen["signal"]
    assert isinstance(signal, Disconnect) and signal.happened
    assert seen["outcome"].startswith("disconnected: the client closed the connection")


async def test_without_the_callback_receive_is_watched_as_before() -> None:
    seen: dict[str, Any] = {}
    async with live_server(watching_app(seen)) as url:  # uvicorn's own protocol: no callback
        await leave_midway(url, seen)
    assert seen["signal"] is None
    assert seen["outcome"].startswith("disconnected: the client closed the connection")


async def test_a_finished_request_leaves_no_callback_behind() -> None:
    """The callback is removed when the work ends, so a connection kept alive for many requests
    does not collect one per request."""
    app = FastAPI()
    signals: list[Disconnect] = []

    @app.get("/quick")
    async def quick(request: Request) -> JSONResponse:
        signal = disconnect_of(request.scope)
        assert signal is not None
        signals.append(signal)

        async def answer() -> int:
            return 7

        return JSONResponse({"value": await unless_disconnected(request, answer())})

    protocol = bounded_protocol(header_timeout_s=10, max_connections=100)
    async with live_server(app, http=protocol) as url, httpx.AsyncClient(base_url=url) as client:
        for _ in range(3):  # one kept-alive connection
            assert (await client.get("/quick")).json() == {"value": 7}
    assert len({id(s) for s in signals}) == 3  # one per request
    assert all(s._callbacks == [] for s in signals)


def test_a_callback_added_after_the_client_left_runs_at_once() -> None:
    signal = Disconnect()
    calls: list[str] = []
    signal.add(lambda: calls.append("early"))
    signal.fire()
    signal.fire()  # once only
    signal.add(lambda: calls.append("late"))
    assert calls == ["early", "late"]


@pytest.mark.parametrize("discarded", [True, False])
def test_a_discarded_callback_is_not_called(discarded: bool) -> None:
    signal = Disconnect()
    calls: list[int] = []

    def callback() -> None:
        calls.append(1)

    signal.add(callback)
    if discarded:
        signal.discard(callback)
    signal.fire()
    assert calls == ([] if discarded else [1])
