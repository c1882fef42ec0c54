"""Run the server, or load every model once and report (--dry-run)."""

from __future__ import annotations

import asyncio
import logging

import typer
import uvicorn

from modelpool.api.app import create_app
from modelpool.config.schema import Config
from modelpool.errors import ConfigError, ModelpoolError
from modelpool.logs import configure_logging
from modelpool.runtime.pool import ModelPool, build_pool

log = logging.getLogger("modelpool")


def run_server(config: Config) -> None:
    configure_logging(config.server.log_format, config.server.log_level)
    try:
        app = create_app(config)
    except ConfigError as exc:
        typer.secho(f"error: {exc.message}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    server = config.server
    log.info(
        "starting modelpool",
        extra={"host": server.host, "port": server.port, "models": [m.id for m in config.served_models()]},
    )
    uvicorn.run(
        app,
        host=server.host,
        port=server.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )


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
    for slot in pool.slots():
        try:
            await slot.ensure_ready(None)
        except ModelpoolError:
            failures += 1
            typer.secho(f"FAILED  {slot.id}: {slot.error}", fg=typer.colors.RED)
        else:
            typer.echo(f"ok      {slot.id}  ({slot.load_seconds:.2f}s)")
    await pool.close()
    return 1 if failures else 0
