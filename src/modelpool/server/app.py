"""The one place the app is assembled: the HTTP routes (`api/`), error rendering, the MCP
server (`mcp_server/`), the workbench (`ui/`), the middlewares and the pool's lifetime.
`api`, `mcp_server` and `ui` are leaves that know nothing of each other; this module wires
what they share through `app.state` (the pool, the config, the stores)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from modelpool import __version__
from modelpool.api.errors import install_error_handlers
from modelpool.api.routes import (
    admin,
    audio,
    chat,
    completions,
    embeddings,
    health,
    llama_embeddings,
    messages,
    models,
    realtime,
    rerank,
    responses,
    scoring,
    tokenize,
)
from modelpool.config.schema import Config
from modelpool.mcp_server import transcript_dir
from modelpool.mcp_server.transcripts import TranscriptLimits, TranscriptStore
from modelpool.runtime.build import build_pool
from modelpool.runtime.live.transcriber import LiveTranscriber
from modelpool.runtime.metrics.history import MetricsHistory
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.responses.store import ResponseStore
from modelpool.runtime.served import ServedPool
from modelpool.server.auth import KeyRing, RequireKeys
from modelpool.server.batches import add_batch_api
from modelpool.server.cors import add_cors
from modelpool.server.host_guard import BrowserRule, HostGuard
from modelpool.server.lifespan import Lifetime
from modelpool.server.mcp_mount import add_mcp
from modelpool.server.middleware import FORM_OVERHEAD, BodyLimit, RequestContext
from modelpool.server.openapi import publish_contract
from modelpool.server.ratelimit import add_rate_limits
from modelpool.server.reload import ConfigSources, Reloader
from modelpool.server.tracing import Stop, install_tracing
from modelpool.server.ui import mount_ui

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

_ROUTERS = (chat, completions, responses, messages, embeddings, llama_embeddings, rerank, tokenize, audio, scoring,
            realtime, models, health, admin)  # fmt: skip


def create_app(
    config: Config,
    pool: ServedPool | None = None,
    keys: KeyRing | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
    sources: ConfigSources | None = None,
) -> FastAPI:
    """Build the app. The pool preloads in the background after start-up, so /healthz
    answers at once and /readyz turns 200 when the preloaded models are ready.
    `tracer_provider`: trace requests to it (tests), whatever `server.otel_endpoint` says.
    `sources`: where `config` came from, to re-read it (`POST /v1/admin/reload`, SIGHUP,
    `server.watch_config`); None: this app cannot reload its config (409)."""
    pool = pool or build_pool(config)
    history = MetricsHistory(pool.metrics.registry, pool.statuses, pool.clock)
    lifetime = Lifetime(config.state_dir, pool, history)
    # The interactive docs load their scripts from a CDN: only when the config asks for them.
    docs = config.server.api_docs
    app = FastAPI(title="modelpool", version=__version__, lifespan=lifetime,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)  # fmt: skip
    keys = keys or KeyRing.from_config(config.auth)
    _add_state(app, config, pool, history)
    install_error_handlers(app)
    for module in _ROUTERS:
        app.include_router(module.router)
    lifetime.batches = add_batch_api(app, config)
    lifetime.mcp = add_mcp(app, config)
    if config.server.ui:
        mount_ui(app)
    publish_contract(app, keys)
    lifetime.stop_tracing = _add_middlewares(app, config, pool, keys, tracer_provider)
    lifetime.usage = app.state.usage_history
    lifetime.reloader = app.state.reloader = _reloader(app, config, pool, keys, sources)
    return app


def _reloader(
    app: FastAPI, config: Config, pool: ServedPool, keys: KeyRing, sources: ConfigSources | None
) -> Reloader | None:
    """Live configuration for a pool in this process started from config sources; None for
    a library app or Ray mode (whose models live in Ray Serve: redeploy there)."""
    if sources is None or not isinstance(pool, ModelPool):
        return None

    def publish(effective: Config) -> None:
        app.state.config = effective

    return Reloader(config, sources, pool, keys, app.state.rate_limiter, publish)


def _add_state(app: FastAPI, config: Config, pool: ServedPool, history: MetricsHistory) -> None:
    """What routes and MCP tools find on `app.state`: the pool (`api/deps.py`), the config,
    the stores they share."""
    server = config.server
    app.state.pool = pool
    app.state.config = config
    app.state.metrics_history = history
    app.state.responses = ResponseStore(server.response_store_size, server.response_store_bytes)
    app.state.realtime = realtime.RealtimeStats(server.realtime_queue_events)
    app.state.live_sessions = LiveTranscriber  # a `LiveSessions`: the realtime route opens its sessions with it
    app.state.transcripts = TranscriptStore(transcript_dir(config), TranscriptLimits.of(server))


def _add_middlewares(
    app: FastAPI, config: Config, pool: ServedPool, keys: KeyRing, tracer_provider: TracerProvider | None
) -> Stop:
    """Innermost first: each `add_middleware` wraps what was added before it. Returns what
    the lifespan awaits at its end to stop tracing."""
    server = config.server
    app.add_middleware(BodyLimit, max_bytes=server.max_body_bytes, max_upload_bytes=server.max_upload_bytes,
                       body_timeout_s=server.body_timeout_s,
                       max_file_bytes=config.batch_api.max_file_bytes + FORM_OVERHEAD)  # fmt: skip
    add_rate_limits(app, config, pool.metrics, pool.metrics_label)  # inside RequireKeys, which names the key
    app.add_middleware(RequireKeys, keys=keys)
    stop_tracing = install_tracing(app, server, tracer_provider)  # inside RequestContext: has its request id
    app.add_middleware(RequestContext, metrics=pool.metrics, model_label=pool.metrics_label)
    add_cors(app, server)  # outside the rest, so 401s and the last-resort 500 carry CORS headers too
    app.add_middleware(HostGuard, rule=BrowserRule.from_config(server))  # outermost: refuses before anything
    return stop_tracing
