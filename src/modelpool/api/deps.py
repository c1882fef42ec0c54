"""What routes need from the app, looked up per request (no module globals)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from modelpool.errors import ClientDisconnected
from modelpool.runtime.pool import ModelPool

T = TypeVar("T")


def pool_of(request: Request) -> ModelPool:
    pool: ModelPool = request.app.state.pool
    return pool


def wants_metrics(request: Request, asked: bool) -> bool:
    """Timing metrics go into a response when the request asks or the server config says so."""
    return asked or bool(request.app.state.config.server.timing_metrics)


def note_model(request: Request, model: str) -> None:
    """Label this request's metrics and access-log line with the model it asked for."""
    request.state.model_id = model


@dataclass(frozen=True)
class ResponseMeta:
    """id/created/model of one response, shared by all its stream chunks."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseMeta:
        return cls(id=f"{prefix}-{secrets.token_hex(12)}", model=model)


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
