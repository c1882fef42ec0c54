"""What runs for as long as the app serves, in order: orphaned engines reaped, the pool
started (it preloads in the background), the metrics history sampled, SIGHUP and the config
file watched (`reload.py`), the MCP session
manager's task group open; at the end the same undone in reverse, and the last traces sent."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from modelpool.runtime.batches.runner import BatchRunner
from modelpool.runtime.memory import settle_heap
from modelpool.runtime.metrics.history import MetricsHistory
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.runtime.served import ServedPool
from modelpool.server.reload import Reloader
from modelpool.server.tracing import Stop, nothing_to_stop
from modelpool.services.reaper import reap_orphaned_engines

if TYPE_CHECKING:  # the MCP SDK is the [mcp] extra: imported only when /mcp is mounted
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

log = logging.getLogger("modelpool")


@dataclass
class Lifetime:
    """The app's lifespan. `mcp` and `stop_tracing` are filled in as the app is assembled,
    after FastAPI was handed this object (the MCP mount and the tracing middleware need the app)."""

    state_dir: Path | None
    """Where the engines of a modelpool that died are recorded (None: the default)."""
    pool: ServedPool
    history: MetricsHistory
    mcp: StreamableHTTPSessionManager | None = None
    """The MCP session manager (None: MCP is off, or its extra is not installed)."""
    stop_tracing: Stop = nothing_to_stop
    batches: BatchRunner | None = None
    usage: UsageStore | None = None
    """The durable usage store: flushes while the app serves, and once more at the end (None: off)."""
    """The Batches API's runner: resumes unfinished batches once the pool started (None: off)."""
    reloader: Reloader | None = None
    """Live configuration: SIGHUP and the file watch run with the app (None: no config sources)."""

    @contextlib.asynccontextmanager
    async def __call__(self, _: FastAPI) -> AsyncIterator[None]:
        await reap_orphaned_engines(self.state_dir)  # before preloading: they hold memory and ports
        self.pool.start()
        self.history.start()
        if self.usage is not None:
            self.usage.start()
        if self.batches is not None:
            self.batches.start()
        if self.reloader is not None:
            self.reloader.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.mcp is not None:  # the MCP session manager's task group
                    await stack.enter_async_context(self.mcp.run())
                settle_heap()  # what start-up built lives as long as the server
                yield
        finally:
            await self._teardown()

    async def _teardown(self) -> None:
        """Each step on its own: one that fails (a broken disk) is logged, the rest still run
        (the models are unloaded whatever happened to the usage store)."""
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = []
        if self.batches is not None:  # before the pool closes: its lines stop, to resume at the next start
            steps.append(("batches", self.batches.close))
        if self.usage is not None:  # the last requests' usage and the budgets as they are
            steps.append(("usage store", self.usage.close))
        if self.reloader is not None:
            steps.append(("reloader", self.reloader.stop))
        steps += [("metrics history", self.history.stop), ("pool", self.pool.close)]
        for name, step in steps:
            try:
                await step()
            except Exception:
                log.exception("shutdown: stopping the %s failed; going on", name)
        log.info("models unloaded")
        await self.stop_tracing()
