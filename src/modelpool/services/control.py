"""Acting on running services by id or name: resolve a target (never guessing between
several), stop services dependents-first, and read or follow a service's log."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from modelpool.errors import ConfigError
from modelpool.services.pids import is_alive
from modelpool.services.process import terminate_group
from modelpool.services.registry import Registry, ServiceRecord


class AmbiguousService(ConfigError):
    """A name that several running services answer to."""


def resolve(registry: Registry, target: str) -> ServiceRecord | None:
    """The running service whose id is `target`, or whose name (or `stack/name`) is; None
    when nothing running matches. Several matches are an error that lists them."""
    records = registry.records()
    for record in records:
        if record.id == target:
            return record
    matches = [r for r in records if target in (r.name, f"{r.stack}/{r.name}")]
    if len(matches) > 1:
        listing = "\n".join(f"  {r.id}  {r.name}  {r.url}  started {started(r)}" for r in matches)
        raise AmbiguousService(f"{len(matches)} running services are called {target!r}; name one by id:\n{listing}")
    return matches[0] if matches else None


def started(record: ServiceRecord) -> str:
    return datetime.datetime.fromtimestamp(record.started_at).strftime("%Y-%m-%d %H:%M:%S")


def stop_order(records: list[ServiceRecord]) -> list[ServiceRecord]:
    """Dependents before what they depend on (within a stack); otherwise newest first."""
    remaining = sorted(records, key=lambda r: -r.started_at)
    ordered: list[ServiceRecord] = []
    while remaining:
        needed = {(r.stack, d) for r in remaining for d in r.extra.get("depends_on", [])}
        free = [r for r in remaining if (r.stack, r.name) not in needed] or remaining[:1]
        ordered += free
        remaining = [r for r in remaining if r not in free]
    return ordered


async def stop_services(
    registry: Registry,
    records: list[ServiceRecord],
    grace_s: float | None = None,
    on_stopped: Callable[[ServiceRecord, str], None] = lambda record, outcome: None,
) -> None:
    """SIGTERM each process group, SIGKILL after its grace period; dependents first.
    `on_stopped(record, outcome)` with outcome "terminated", "killed" or "gone"."""
    for record in stop_order(records):
        grace = grace_s if grace_s is not None else float(record.extra.get("stop_grace_s", 20.0))
        outcome = await terminate_group(record.pid, grace, name=record.name) if record.alive() else "gone"
        registry.remove(record.id)
        on_stopped(record, outcome)


def find_log(registry: Registry, target: str) -> tuple[Path, ServiceRecord | None]:
    """The log file of a running service; for one that has stopped, the log its stack left
    at `<state_dir>/logs/<stack>/<name>.log` (target: `name` or `stack/name`)."""
    record = resolve(registry, target)
    if record is not None:
        if not record.log_file:
            raise ConfigError(f"service {record.id} has no log file")
        return Path(record.log_file), record
    stack, _, name = target.rpartition("/")
    candidates = sorted((registry.state_dir / "logs").glob(f"{stack or '*'}/{name}.log"))
    if not candidates:
        raise ConfigError(f"no running service and no log called {target!r} (see `modelpool status`)")
    if len(candidates) > 1:
        listing = "\n".join(f"  {p.parent.name}/{name}" for p in candidates)
        raise AmbiguousService(f"several stacks have a log for {target!r}; name one as stack/name:\n{listing}")
    return candidates[0], None


def follow(path: Path, record: ServiceRecord, poll_s: float = 0.2) -> Iterator[str]:
    """Lines appended to `path` from its current end, until the process exits."""
    position = path.stat().st_size if path.exists() else 0
    pending = ""
    while True:
        alive = is_alive(record.pid, record.started_at)
        if path.exists():
            with path.open("rb") as handle:
                handle.seek(position)
                chunk = handle.read()
            position += len(chunk)
            pending += chunk.decode("utf-8", errors="replace")
            *complete, pending = pending.split("\n")
            yield from complete
        if not alive:
            if pending:
                yield pending
            return
        time.sleep(poll_s)

