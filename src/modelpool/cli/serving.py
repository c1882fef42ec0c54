"""Run the server, or load every model once and report (--dry-run)."""

from __future__ import annotations

import asyncio
import logging
import signal

import typer
import uvicorn
from fastapi import FastAPI

from modelpool.config.loader import unread_environment
from modelpool.config.schema import Config
from modelpool.errors import ConfigError, ModelpoolError
from modelpool.logs import configure_logging
from modelpool.runtime.build import build_pool
from modelpool.runtime.pool import ModelPool
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing, check_exposure
from modelpool.server.http_protocol import bounded_protocol, default_max_connections
from modelpool.server.reload import ConfigSources
from modelpool.wire.openai.realtime import MAX_EVENT_CHARS

log = logging.getLogger("modelpool")


def run_server(config: Config, sources: ConfigSources | None = None) -> None:
    """Serve `config`; `sources` re-read it on a reload (`server/reload.py`)."""
    configure_logging(config.server.log_format, config.server.log_level)
    _log_unread_environment()
    try:
        keys = KeyRing.from_config(config.auth)
        check_exposure(config, keys)
        app = create_app(config, keys=keys, sources=sources)
    except ConfigError as exc:
        typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    server = config.server
    log.info(
        "starting modelpool",
        extra={
            "host": server.host,
            "port": server.port,
            "models": [m.id for m in config.served_models()],
            "auth": "api keys" if keys.enabled else "none (loopback only)",
        },
    )
    _exit_zero_after_graceful_shutdown()
    uvicorn.Server(uvicorn_config(app, config)).run()


def _log_unread_environment() -> None:
    """The loader's own debug line came before logging was set up: say it again, names only."""
    unread = unread_environment()
    if unread:
        log.debug("ignored environment variables (no config path): %s", ", ".join(unread))


def uvicorn_config(app: FastAPI, config: Config) -> uvicorn.Config:
    """How uvicorn serves the app: the bounds it keeps (headers, connections, WebSocket
    frames) and the proxies whose forwarding headers it believes."""
    server = config.server
    proxies = server.forwarded_allow_ips
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=bounded_protocol(server.header_timeout_s, server.max_connections or default_max_connections()),
        ws_max_size=MAX_EVENT_CHARS + 1024,  # a bigger WebSocket frame is refused before it is buffered
        # uvicorn believes X-Forwarded-For from loopback by default: any local client could
        # then pick its address (and its per-address rate-limit bucket). Only named proxies.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
        # uvicorn annotates int but hands the value to asyncio.wait_for, which takes float seconds.
        timeout_graceful_shutdown=server.shutdown_grace_s,  # type: ignore[arg-type]
    )


def _exit_zero_after_graceful_shutdown() -> None:
    """uvicorn shuts down gracefully on SIGTERM/SIGINT and then re-raises the signal to the
    handler that was installed before it; a no-op one here makes a clean stop exit 0."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)


def dry_run_models(config: Config) -> int:
    """Load every served model, print how each went, and return the exit code (1 on any failure)."""
    configure_logging(config.server.log_format, "warning")
    try:
        pool = build_pool(config)
    except ConfigError as exc:
        typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
        return 2
    return asyncio.run(_load_all(pool))


async def _load_all(pool: ModelPool) -> int:
    failures = 0
    for model in [status.id for status in pool.statuses()]:
        try:
            await pool.load(model)
        except ModelpoolError:
            failures += 1
            typer.secho(f"FAILED  {model}: {pool.status(model).last_error}", fg=typer.colors.RED)
        else:
            typer.echo(f"ok      {model}  ({pool.status(model).load_seconds or 0.0:.2f}s)")
    await pool.close()
    return 1 if failures else 0
