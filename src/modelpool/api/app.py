"""The ASGI app: routes, error rendering, middleware, and the pool's lifetime."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import FastAPI

from modelpool import __version__
from modelpool.api.auth import KeyRing, RequireKeys
from modelpool.api.cors import add_cors
from modelpool.api.errors import install_error_handlers
from modelpool.api.host_guard import BrowserRule, HostGuard
from modelpool.api.middleware import BodyLimit, RequestContext
from modelpool.api.ratelimit import add_rate_limits
from modelpool.api.routes import (
    admin,
    audio,
    chat,
    completions,
    embeddings,
    health,
    messages,
    models,
    realtime,
    rerank,
    responses,
    scoring,
    tokenize,
)
from modelpool.api.routes.ui import mount_ui
from modelpool.api.tracing import install_tracing
from modelpool.config.schema import Config
from modelpool.mcp_server import transcript_dir
from modelpool.mcp_server.server import mount_mcp, running
from modelpool.mcp_server.transcripts import TranscriptLimits, TranscriptStore
from modelpool.runtime.build import build_pool
from modelpool.runtime.metrics_history import MetricsHistory
from modelpool.runtime.pool_api import PoolApi
from modelpool.runtime.response_store import ResponseStore
from modelpool.services.reaper import reap_orphaned_engines

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("modelpool")


def create_app(
    config: Config,
    pool: PoolApi | None = None,
    keys: KeyRing | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """Build the app. The pool preloads in the background after start-up, so /healthz
    answers at once and /readyz turns 200 when the preloaded models are ready.
    `tracer_provider`: trace requests to it (tests), whatever `server.otel_endpoint` says."""
    pool = pool or build_pool(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await reap_orphaned_engines(config.state_dir)  # before preloading: they hold memory and ports
        pool.start()
        app.state.metrics_history.start()
        try:
            async with running(app.state.mcp):  # the MCP session manager's task group
                yield
        finally:
            await app.state.metrics_history.stop()
            await pool.close()
            log.info("models unloaded")
            await stop_tracing()

    # The interactive docs load their scripts from a CDN: only when the config asks for them.
    docs = config.server.api_docs
    app = FastAPI(title="modelpool", version=__version__, lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)  # fmt: skip
    app.state.pool = pool
    app.state.config = config
    app.state.metrics_history = MetricsHistory(pool.metrics.registry, pool.statuses, pool.clock)
    app.state.responses = ResponseStore(config.server.response_store_size, config.server.response_store_bytes)
    app.state.realtime = realtime.RealtimeStats(config.server.realtime_queue_events)
    install_error_handlers(app)
    inference = (chat, completions, responses, messages, embeddings, rerank, tokenize, audio, scoring)
    for module in (*inference, realtime, models, health, admin):
        app.include_router(module.router)
    app.state.transcripts = TranscriptStore(transcript_dir(config), TranscriptLimits.of(config.server))
    app.state.mcp = mount_mcp(app, config) if config.server.mcp else None
    if config.server.ui:
        mount_ui(app)
    app.add_middleware(
        BodyLimit,
        max_bytes=config.server.max_body_bytes,
        max_upload_bytes=config.server.max_upload_bytes,
        body_timeout_s=config.server.body_timeout_s,
    )
    add_rate_limits(app, config.auth, pool.metrics)  # inside RequireKeys, which names the key
    app.add_middleware(RequireKeys, keys=keys or KeyRing.from_config(config.auth))
    stop_tracing = install_tracing(app, config.server, tracer_provider)  # inside RequestContext: has its request id
    app.add_middleware(RequestContext, metrics=pool.metrics, model_label=pool.metrics_label)
    add_cors(app, config.server)  # outside the rest, so 401s and the last-resort 500 carry CORS headers too
    app.add_middleware(HostGuard, rule=BrowserRule.from_config(config.server))  # outermost: refuses before anything
    return app
