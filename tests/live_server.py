"""A modelpool app served by uvicorn on 127.0.0.1 (a free port) inside the test's event
loop, for clients that must talk over a real socket (the MCP SDK's own HTTP client)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from tests.polling import until


@contextlib.asynccontextmanager
async def live_server(
    app: FastAPI | ASGIApp, *, lifespan: bool = True, http: type[asyncio.Protocol] | None = None
) -> AsyncIterator[str]:
    """Serve `app` while the block runs; yields its base URL. `lifespan=False` serves an app
    whose lifespan already runs (the session's shared app) without starting it again; `http`:
    the HTTP protocol class, if not uvicorn's own."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on" if lifespan else "off", http=http or "auto"
    )
    server = uvicorn.Server(settings)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done(), "uvicorn to start", timeout_s=60)
        if task.done():
            task.result()  # start-up failed: raise why
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
