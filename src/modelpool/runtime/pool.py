"""The pool as a library: the served models and every request, admin and status operation
(`ModelPool`), its lifetime (preload, readiness, idle reaping, close).

The operations live in `text_requests`, `audio_requests` and `admin`, on `pool_base`."""

from __future__ import annotations

import asyncio
import logging

from modelpool.errors import (
    ModelLoadFailed,
    ModelNotReady,
    ModelpoolError,
    ShuttingDown,
)
from modelpool.runtime.admin import PoolAdmin
from modelpool.runtime.audio_requests import AudioRequests
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.pool_reload import PoolReload
from modelpool.runtime.served import ServedPool
from modelpool.runtime.text_requests import TextRequests

log = logging.getLogger("modelpool.runtime")


class ModelPool(TextRequests, AudioRequests, PoolAdmin, PoolReload):
    # ----- lifetime ------------------------------------------------------------------

    def start(self) -> None:
        """Preload and start reaping idle models (call from inside the event loop)."""
        self._tasks = [
            asyncio.create_task(self.preload(), name="preload"),
            asyncio.create_task(self._reap_forever(), name="reaper"),
        ]

    async def preload(self) -> None:
        """Load every `preload: true` model; failures are kept on their slots, not raised."""
        wanted = [slot for slot in self._slots.values() if slot.config.preload]
        for slot in wanted:  # each runtime imported alone first: its memory is measured as its own
            await slot.import_runtimes()
        await asyncio.gather(*(slot.ensure_ready(None, explicit=True) for slot in wanted), return_exceptions=True)

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, model → state) where ready means every preloaded model is ready."""
        states = {slot.id: slot.state.value for slot in self._slots.values()}
        ready = not self._closing and all(
            slot.state is SlotState.READY for slot in self._slots.values() if slot.config.preload
        )
        return ready, states

    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None:
        """Why the pool — or, given a name, that one model — is not ready, as the error a
        request would get (load error before not-ready); None when ready. Unknown name:
        ModelNotFound is raised."""
        if self._closing:
            return ShuttingDown("the server is shutting down")
        if name is not None:
            return self.slot(name).readiness_problem()
        waiting = [slot for slot in self._slots.values() if slot.config.preload and slot.state is not SlotState.READY]
        failed = [slot for slot in waiting if slot.state is SlotState.FAILED]
        if failed:
            reasons = "; ".join(f"model '{slot.id}' failed to load: {slot.record.error}" for slot in failed)
            return ModelLoadFailed(reasons, retry_after_s=max(slot.config.retry_cooldown_s for slot in failed))
        if waiting:
            states = ", ".join(f"'{slot.id}' ({slot.state.value})" for slot in waiting)
            return ModelNotReady(f"waiting for preloaded models: {states}")
        return None

    async def close(self) -> None:
        """Refuse new work, let running work finish, unload everything."""
        self._closing = True
        for slot in self._slots.values():
            slot.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.finish_reloads()
        await asyncio.gather(*(slot.unload() for slot in self._slots.values()), return_exceptions=True)

    async def reap_idle(self) -> list[str]:
        """Unload every model idle past its keep_alive; returns their ids."""
        expired = [slot for slot in self._slots.values() if slot.expired()]
        for slot in expired:
            log.info("unloading idle model", extra={"model": slot.id})
            await slot.unload()
        return [slot.id for slot in expired]

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            try:
                await self.reap_idle()
                await self.apply_pending()  # a config reload's changed models, once idle
            except Exception:
                log.exception("idle reaping failed")


def _implements(pool: ModelPool) -> ServedPool:
    return pool  # mypy checks here that ModelPool implements the whole interface
