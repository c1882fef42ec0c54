"""The running services a `service:` role names (`modelpool up`), read from the services
registry file, read-only.

The server side writes that file and owns its format (`services/registry.py`: a JSON object
`{"services": [{"id", "name", "url", "pid", "started_at", "stack", ...}]}`, replaced whole
on every change, so a reader never sees half of one). The SDK keeps its own small reader so
that it imports nothing of the server; `tests/client/test_service_registry.py` checks on a
real file that this reader and the registry's writer agree.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from modelpool.client.errors import ConfigError

STATE_DIR_ENV = "MODELPOOL_STATE_DIR"
REGISTRY_FILE = "services.json"


class AmbiguousService(ConfigError):
    """A name that several running services answer to."""


@dataclass(frozen=True)
class RunningService:
    """One entry of the registry: the fields the SDK reads."""

    id: str
    name: str
    url: str
    pid: int
    started_at: float
    """Process creation time (epoch seconds): a pid reused by another process is not this service."""
    stack: str | None = None

    def alive(self) -> bool:
        """Running, not a zombie, and the very process recorded (not another one that took its pid)."""
        try:
            process = psutil.Process(self.pid)
            return process.status() != psutil.STATUS_ZOMBIE and abs(process.create_time() - self.started_at) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def default_state_dir() -> Path:
    """Where modelpool keeps the registry: $MODELPOOL_STATE_DIR, else
    $XDG_STATE_HOME/modelpool, else ~/.local/state/modelpool (as the server side has it)."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "modelpool"


def running_services(state_dir: Path | None = None) -> list[RunningService]:
    """Every entry whose process still runs. No file (nothing was ever started) or one that
    is not JSON is no services; entries of a shape this reader does not know are skipped."""
    path = (state_dir or default_state_dir()) / REGISTRY_FILE
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return []
    entries = raw.get("services", []) if isinstance(raw, dict) else []
    found = (_entry(item) for item in entries if isinstance(item, Mapping))
    return [service for service in found if service is not None and service.alive()]


def resolve(services: list[RunningService], target: str) -> RunningService | None:
    """The service whose id is `target`, or whose name (or `stack/name`) is; None when none
    matches. Several matches are an error that lists them, never a guess."""
    for service in services:
        if service.id == target:
            return service
    matches = [s for s in services if target in (s.name, f"{s.stack}/{s.name}")]
    if len(matches) > 1:
        listing = "\n".join(f"  {s.id}  {s.name}  {s.url}  started {_started(s)}" for s in matches)
        raise AmbiguousService(f"{len(matches)} running services are called {target!r}; name one by id:\n{listing}")
    return matches[0] if matches else None


def _entry(item: Mapping[str, Any]) -> RunningService | None:
    try:
        stack = item.get("stack")
        return RunningService(
            id=str(item["id"]),
            name=str(item["name"]),
            url=str(item["url"]),
            pid=int(item["pid"]),
            started_at=float(item["started_at"]),
            stack=None if stack is None else str(stack),
        )
    except (KeyError, TypeError, ValueError):
        return None  # an entry from an incompatible version


def _started(service: RunningService) -> str:
    return datetime.datetime.fromtimestamp(service.started_at).strftime("%Y-%m-%d %H:%M:%S")
