"""Admin operations (load with overrides, rescale, unload) and the typed status snapshots the
API renders."""

from __future__ import annotations

import dataclasses
from typing import Any

from modelpool.capabilities import Locality
from modelpool.config.schema import ModelConfig
from modelpool.errors import (
    ConfigError,
    InvalidRequest,
)
from modelpool.runtime.adapters import adapter_backends, split_adapter
from modelpool.runtime.memory_report import pool_memory
from modelpool.runtime.option_schema import check_override
from modelpool.runtime.pool_base import PoolBase
from modelpool.runtime.slot import ModelSlot
from modelpool.status import EngineLogs, ModelStatus, PoolMemory


class PoolAdmin(PoolBase):
    # ----- admin ---------------------------------------------------------------------

    async def load(self, name: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None) -> None:
        """Load (or reload with live option overrides, or rescale) a model. Config files are
        never rewritten: overrides last until the next unload-and-reload or restart."""
        slot = self.slot(name)
        if replicas is not None and not 1 <= replicas <= slot.config.replica_max:
            raise InvalidRequest(
                f"replicas must be between 1 and replica_max ({slot.config.replica_max})", param="replicas"
            )
        if overrides:
            config = self.with_overrides(name, overrides)
            await slot.reconfigure(config, self._resolve(config))
        if replicas is not None and replicas != slot.config.replicas:
            await slot.scale(replicas)
        slot.forgive_crashes()
        await slot.ensure_ready(None, explicit=True)

    async def unload(self, name: str, *, drain: bool = True) -> None:
        await self.slot(name).unload(drain=drain)

    async def load_adapter(self, name: str, adapter: str) -> None:
        """Load one of the model's declared adapters into every running replica now (a
        request would load it on first use). Only declared adapters: never a file an admin names."""
        name, _ = split_adapter(self._names, name, adapter)
        for backend in adapter_backends(self.slot(name)):
            await backend.load_adapter(adapter)

    async def unload_adapter(self, name: str, adapter: str) -> None:
        """Unload an idle adapter from every running replica (429 while a request uses it)."""
        name, _ = split_adapter(self._names, name, adapter)
        for backend in adapter_backends(self.slot(name)):
            await backend.unload_adapter(adapter)

    def with_overrides(self, name: str, overrides: dict[str, Any]) -> ModelConfig:
        """The config of the model `name` names with live option `overrides`, checked as a
        load would check them (InvalidRequest naming `overrides` if not)."""
        slot = self.slot(name)
        config, allowed = slot.config, slot.capabilities.overridable
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise InvalidRequest(
                f"backend '{config.backend}' cannot override {', '.join(unknown)} at load time "
                f"(it can: {', '.join(sorted(allowed))})",
                param="overrides",
            )
        candidate = config.model_copy(update={"options": {**config.options, **overrides}})
        try:
            self._resolve(candidate)
        except ConfigError as exc:
            raise InvalidRequest(exc.message, param="overrides") from None
        check_override(self._configured[slot.id], candidate)
        return candidate

    # ----- status --------------------------------------------------------------------

    def statuses(self) -> list[ModelStatus]:
        return [self._status_of(slot) for slot in self._slots.values()]

    def status(self, name: str) -> ModelStatus:
        return self._status_of(self.slot(name))

    def _status_of(self, slot: ModelSlot) -> ModelStatus:
        """The slot's status, and whether a reload's new config waits for it (the pool's to know)."""
        status = slot.status()
        return dataclasses.replace(status, reload_pending=True) if slot.id in self._pending else status

    async def engine_logs(self, name: str, lines: int) -> EngineLogs:
        """The last output of the model's engine processes; 400 for a model inside modelpool."""
        slot = self.slot(name)
        if slot.capabilities.declared.locality is not Locality.ENGINE_PROCESS:
            raise InvalidRequest(
                f"model '{slot.id}' runs inside modelpool (backend '{slot.config.backend}'); its output is "
                "modelpool's own log",
                param="model",
            )
        return slot.engine_logs(lines)

    def memory(self) -> PoolMemory:
        return pool_memory(self.slots(), self.capacity)
