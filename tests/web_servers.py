"""A real aiohttp server on 127.0.0.1 (a free port), for tests that fetch from one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def web_server(app: web.Application) -> AsyncIterator[int]:
    """Serve `app` on loopback while the block runs; yields the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
