"""Engines that outlived the modelpool that started them. An engine that is not
`persistent` dies with modelpool (the parent-death signal, see `process`); as a second
line, each one is recorded with its owner in `engines.json` while it runs, and a modelpool
that starts stops the ones whose owner is gone (killed, or ended by the OOM killer before
the signal could help, an engine that ignored it): they would hold memory and a port for
nobody. A record names its process by pid *and* creation time, and only this user's
processes are stopped, so a pid reused by someone else's process is never touched. An engine
run as a container is stopped through its runtime (`stop`, then `kill`), and only while the
container by the recorded name still has the recorded init pid."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelpool.services.container_cli import stop_recorded_container
from modelpool.services.pids import create_time, is_alive, started_by_us
from modelpool.services.process import terminate_group
from modelpool.services.registry import Registry, ServiceRecord

log = logging.getLogger("modelpool.services")
OWNED_ENGINES_FILE = "engines.json"
OWNED_ENGINE_KIND = "owned-engine"
DEFAULT_GRACE_S = 10.0


def owned_engines(state_dir: Path | None) -> Registry:
    """The registry of engines that die with their modelpool (apart from the persistent ones)."""
    return Registry(state_dir, OWNED_ENGINES_FILE)


def ownership(stop_grace_s: float) -> dict[str, Any]:
    """The `extra` of an owned engine's record: this modelpool, as pid and creation time."""
    pid = os.getpid()
    return {"owner_pid": pid, "owner_started_at": create_time(pid), "stop_grace_s": stop_grace_s}


def orphaned(record: ServiceRecord) -> bool:
    owner, started_at = record.extra.get("owner_pid"), record.extra.get("owner_started_at")
    if not isinstance(owner, int) or not isinstance(started_at, float):
        return False  # not an owned engine's record: not ours to judge
    return not is_alive(owner, started_at)


async def reap_orphaned_engines(state_dir: Path | None) -> list[ServiceRecord]:
    """Stop every recorded engine whose modelpool is gone; returns their records. A state
    directory that cannot be read is no reason not to start: it is logged."""
    registry = owned_engines(state_dir)
    try:
        orphans = [r for r in registry.records() if orphaned(r)]
    except OSError as exc:
        log.warning("cannot read the registry of engines to reap", extra={"path": str(registry.path), "error": exc})
        return []
    stopped = await asyncio.gather(*(_stop(registry, record) for record in orphans))
    return [record for record, done in zip(orphans, stopped, strict=True) if done]


async def _stop(registry: Registry, record: ServiceRecord) -> bool:
    if not started_by_us(record.pid, record.started_at):
        registry.remove(record.id)  # not the process recorded, or not ours: forget, never signal
        return False
    grace = float(record.extra.get("stop_grace_s", DEFAULT_GRACE_S))
    log.warning(
        "stopping an engine a modelpool that is gone left running",
        extra={"service": record.name, "pid": record.pid, "port": record.port, "owner": record.extra["owner_pid"]},
    )
    if "container" in record.extra:
        outcome = await stop_recorded_container(record, grace)
    else:
        outcome = await terminate_group(record.pid, grace, name=record.name)
    registry.remove(record.id)
    return outcome != "gone"


def owned_record(record: ServiceRecord, stop_grace_s: float) -> ServiceRecord:
    """`record` as an owned engine's (its kind, and this modelpool as its owner)."""
    return replace(record, kind=OWNED_ENGINE_KIND, extra={**record.extra, **ownership(stop_grace_s)})
