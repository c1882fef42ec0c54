"""What routes need from the app, looked up per request (no module globals)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request

from modelpool.errors import ClientDisconnected
from modelpool.runtime.pool_api import PoolApi
from modelpool.runtime.timing import RequestTiming

T = TypeVar("T")


def pool_of(request: Request) -> PoolApi:
    pool: PoolApi = request.app.state.pool
    return pool


def metrics_field(request: Request, asked: bool, timing: RequestTiming) -> dict[str, Any]:
    """`{"metrics": {...}}` when the request asks for timing metrics or the config says to
    always add them, else {}. `server_ms` is the time since the request reached the server."""
    if not (asked or request.app.state.config.server.timing_metrics):
        return {}
    received = getattr(request.state, "received_at", None)
    server_ms = None if received is None else round((time.monotonic() - received) * 1000, 3)
    return {"metrics": {**timing.as_json(), "server_ms": server_ms}}


def note_model(request: Request, model: str) -> None:
    """Label this request's metrics and access-log line with the model it asked for."""
    request.state.model_id = model


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`, cancelling it if the client goes away first: a request still in the
    queue leaves it, a running generation stops at its next token and frees the model."""
    task = asyncio.ensure_future(work)
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if gone.is_set():
            raise ClientDisconnected("the client closed the connection before the response") from None
        raise
    finally:
        watcher.cancel()
