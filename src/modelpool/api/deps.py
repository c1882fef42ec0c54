"""What routes need from the app, looked up per request (no module globals)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from fastapi import Request

from modelpool.api.disconnect import disconnect_of
from modelpool.errors import ClientDisconnected
from modelpool.pool_api import PoolApi
from modelpool.pool_api.results import charge
from modelpool.pool_api.results import charged as charged_to
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import USAGE_METER, UsageMeter

T = TypeVar("T")


def pool_of(request: Request) -> PoolApi:
    pool: PoolApi = request.app.state.pool
    return pool


def metrics_field(request: Request, asked: bool, timing: RequestTiming) -> dict[str, Any]:
    """`{"metrics": {...}}` when the request asks for timing metrics or the config says to
    always add them, else {}. `server_ms` is the time since the request reached the server
    (`pool_total_wall_ms` under llm-pool's name)."""
    if not (asked or request.app.state.config.server.timing_metrics):
        return {}
    received = getattr(request.state, "received_at", None)
    server_ms = None if received is None else round((time.monotonic() - received) * 1000, 3)
    return {"metrics": {**timing.as_json(), "server_ms": server_ms, "pool_total_wall_ms": server_ms}}


def note_model(request: Request, model: str) -> None:
    """Label this request's metrics and access-log line with the model it asked for."""
    request.state.model_id = model


def meter_of(request: Request) -> UsageMeter | None:
    """The request's usage meter, set by the rate-limit layer (None on routes it does not limit)."""
    meter: UsageMeter | None = request.scope.get("state", {}).get(USAGE_METER)
    return meter


def charged(request: Request, result: T) -> T:
    """`result` of a pool call, its usage charged to the request's caller."""
    charge(meter_of(request), result)
    return result


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work` (a pool call), cancelling it if the client goes away first: a request still
    in the queue leaves it, a running generation stops at its next token and frees the
    model. What it used is charged to the caller (its result's usage, or its error's)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.Event()

    def leave() -> None:
        gone.set()
        task.cancel()

    disconnect = disconnect_of(request.scope)
    stop_watching: Callable[[], object]
    if disconnect is not None:  # modelpool's own server says when the connection goes
        disconnect.add(leave)
        stop_watching = partial(disconnect.discard, leave)
    else:  # any other ASGI server: wait for `http.disconnect`
        stop_watching = asyncio.create_task(_watch(request, leave)).cancel
    try:
        return await charged_to(meter_of(request), task)
    except asyncio.CancelledError:
        if gone.is_set():
            raise ClientDisconnected("the client closed the connection before the response") from None
        raise
    finally:
        stop_watching()


async def _watch(request: Request, leave: Callable[[], None]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            leave()
            return
