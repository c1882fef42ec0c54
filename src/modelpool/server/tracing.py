"""Tracing on or off for an app: the OpenTelemetry middleware when `server.otel_endpoint`
is set (or a test hands in its own provider), else nothing at all — this module imports
OpenTelemetry only once tracing is on, so a server without the `otel` extra starts fine."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI

from modelpool.config.schema import ServerConfig
from modelpool.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

Stop = Callable[[], Awaitable[None]]


async def nothing_to_stop() -> None:
    return None


def install_tracing(app: FastAPI, server: ServerConfig, provider: TracerProvider | None = None) -> Stop:
    """Add the tracing middleware where the app's middleware stack is at this call. Returns
    what the lifespan awaits at its end: the shutdown (a last flush) of a provider modelpool
    made; a provider handed in belongs to its caller, who shuts it down."""
    if provider is None and server.otel_endpoint is None:
        return nothing_to_stop
    try:
        from modelpool.server import otel
    except ImportError as exc:
        raise ConfigError(
            f"server.otel_endpoint is set, but OpenTelemetry is not installed ({exc.name} is missing): "
            "pip install 'modelpool[otel]'"
        ) from None
    if provider is not None:
        app.add_middleware(otel.TraceRequests, provider=provider)
        return nothing_to_stop
    assert server.otel_endpoint is not None  # checked above
    owned = otel.otlp_provider(server.otel_endpoint, server.otel_service_name)
    app.add_middleware(otel.TraceRequests, provider=owned)

    async def stop() -> None:
        await asyncio.to_thread(owned.shutdown)  # sends the last batch: blocking HTTP, off the loop

    return stop
