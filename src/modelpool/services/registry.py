"""The registry of processes that outlive the modelpool that started them (persistent
engine processes, and services of a stack): one JSON file in a state directory, changed
under a lock and replaced atomically, so concurrent modelpools never lose an entry.
Entries whose process is gone (or whose pid now belongs to another process) are pruned
whenever the file is read.

The key an engine demands of its callers is kept beside the registry, one file per entry
readable by its owner alone (`keys/`), never in the entry: `modelpool status --json` prints
entries whole."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modelpool.config.environment import STATE_DIR_ENV, default_state_dir
from modelpool.services.pids import is_alive

__all__ = ["ENGINE_KIND", "STATE_DIR_ENV", "Registry", "ServiceRecord", "default_state_dir"]

ENGINE_KIND = "engine"
"""The kind of a persistent model engine process."""


@dataclass(frozen=True)
class ServiceRecord:
    id: str
    """Unique key, e.g. `engine:smollm2@8101`."""
    name: str
    """What users call it: the model id, or the stack's service name."""
    kind: str
    """`engine` (a persistent model process) or a stack service kind."""
    pid: int
    port: int
    url: str
    started_at: float
    """Process creation time (epoch seconds): guards against a reused pid."""
    stack: str | None = None
    log_file: str | None = None
    health_path: str = "/health"
    extra: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return is_alive(self.pid, self.started_at)


class Registry:
    def __init__(self, state_dir: Path | None = None, file_name: str = "services.json") -> None:
        """`file_name`: another registry in the same directory (the engines modelpools own)."""
        self.state_dir = state_dir or default_state_dir()
        self.path = self.state_dir / file_name
        self._lock_path = self.path.with_suffix(".lock")
        self._keys = self.state_dir / "keys"

    def records(self) -> list[ServiceRecord]:
        """Every live entry (dead ones are pruned from the file)."""
        with self._locked() as entries:
            return list(entries.values())

    def find(self, *, kind: str | None = None, name: str | None = None) -> list[ServiceRecord]:
        return [r for r in self.records() if (kind is None or r.kind == kind) and (name is None or r.name == name)]

    def put(self, record: ServiceRecord) -> None:
        with self._locked() as entries:
            entries[record.id] = record

    def remove(self, record_id: str) -> None:
        with self._locked() as entries:
            entries.pop(record_id, None)  # its key goes with it

    def save_key(self, record_id: str, key: str) -> None:
        """Keep the key the entry's process demands (readable by this user alone)."""
        self._keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(self._key_path(record_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(key)

    def key(self, record_id: str) -> str | None:
        try:
            return self._key_path(record_id).read_text() or None
        except FileNotFoundError:
            return None

    def _forget_key(self, record_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._key_path(record_id).unlink()

    def _key_path(self, record_id: str) -> Path:
        return self._keys / hashlib.sha256(record_id.encode()).hexdigest()[:32]

    @contextmanager
    def _locked(self) -> Iterator[dict[str, ServiceRecord]]:
        """The live entries, under an exclusive lock; changes are written back atomically."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                recorded = self._read()
                entries = {r.id: r for r in recorded if r.alive()}
                before = dict(entries)
                yield entries
                if entries != before or len(entries) != len(recorded):
                    self._write(entries)
                for gone in {r.id for r in recorded} - set(entries):
                    self._forget_key(gone)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[ServiceRecord]:
        try:
            raw = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        records = []
        for item in raw.get("services", []) if isinstance(raw, dict) else []:
            try:
                records.append(ServiceRecord(**item))
            except TypeError:
                continue  # an entry from an incompatible version: dropped
        return records

    def _write(self, entries: dict[str, ServiceRecord]) -> None:
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"services": [asdict(r) for r in entries.values()]}, indent=2))
        os.replace(temporary, self.path)
