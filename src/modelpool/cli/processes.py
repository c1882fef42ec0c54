"""`modelpool stop-persistent`: stop engine processes (and containers) that `persistent: true`
models left running after modelpool stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from modelpool.services.container_cli import stop_recorded_container
from modelpool.services.process import answers_health, terminate_group
from modelpool.services.registry import ENGINE_KIND, Registry, ServiceRecord


def stop_persistent(
    models: Annotated[list[str] | None, typer.Argument(help="Model ids (default: every persistent engine).")] = None,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 20.0,
    state_dir: Annotated[
        Path | None, typer.Option(help="State directory (default: $MODELPOOL_STATE_DIR or ~/.local/state/modelpool).")
    ] = None,
) -> None:
    """Stop persistent engine processes and containers.

    Probe health, SIGTERM the process group (a container: the runtime's `stop`), SIGKILL after
    the grace period. Processes that are not running are skipped."""
    registry = Registry(state_dir)
    records = [r for r in registry.find(kind=ENGINE_KIND) if not models or r.name in models]
    for record in records:
        healthy, outcome = asyncio.run(_stop(record, grace, registry.key(record.id)))
        registry.remove(record.id)
        if outcome != "gone":
            state = "healthy" if healthy else "not answering"
            typer.echo(f"{record.name}\tpid {record.pid}\t{record.url}\t{state}\t{outcome}")


async def _stop(record: ServiceRecord, grace_s: float, api_key: str | None) -> tuple[bool, str]:
    healthy = await answers_health(record.url + record.health_path, api_key)  # the engine's own key
    if "container" in record.extra:
        return healthy, await stop_recorded_container(record, grace_s)
    return healthy, await terminate_group(record.pid, grace_s, name=record.name)
