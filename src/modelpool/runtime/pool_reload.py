"""A re-read config applied to the running pool (`POST /v1/admin/reload`, SIGHUP, the file
watch): new models join (and preload if they say so), removed ones leave the names at once
and drain in the background, hot changes apply at once, and a model whose loaded engine
the change concerns keeps serving its old config until its next idle moment, then reloads.

Checking comes first and changes nothing (`prepare`); applying (`apply`) then cannot fail
half-way: it is synchronous, so no request sees half of a reload."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from modelpool.capabilities import ModelCapabilities
from modelpool.config.reload_diff import ConfigDiff, with_hot_fields
from modelpool.config.schema import Config, ModelConfig
from modelpool.errors import ConfigError
from modelpool.runtime.detached import detached_task
from modelpool.runtime.pool_base import PendingReload, PoolBase
from modelpool.runtime.slot import ModelSlot
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")

NewSlot = Callable[[ModelConfig, ModelCapabilities], ModelSlot]


@dataclass(frozen=True)
class PreparedModels:
    """A re-read config's models, checked against the pool: ready to apply."""

    models: dict[str, ModelConfig]
    resolved: dict[str, ModelCapabilities]
    """The capabilities of every added and reloading model (their options checked)."""
    default_models: dict[Task, str]


class PoolReload(PoolBase):
    new_slot: NewSlot | None = None
    """Builds the slot of a model a reload adds (set by `build_pool`); None: models cannot be added."""

    def prepare(self, wanted: Config, diff: ConfigDiff) -> PreparedModels:
        """Every added, reloading or hot-changed model's capabilities (its backend and options checked) and
        the default models checked against what the models do. ConfigError names the first
        problem; nothing has changed. Reads the pool and changes nothing: it runs in a worker
        thread (resolving a backend may import its engine: torch takes seconds)."""
        if diff.added and self.new_slot is None:
            raise ConfigError("this pool cannot add models (it was not built from a config)")
        models = {model.id: model for model in wanted.served_models()}
        checked = [*diff.added, *(change.id for change in diff.reloading), *(change.id for change in diff.hot)]
        resolved = {model_id: self._resolve(models[model_id]) for model_id in checked}
        for change in diff.hot:  # and what each serves until then: its running settings with the hot ones
            self._resolve(with_hot_fields(self._slots[change.id].config, models[change.id]))
        names = {name: model_id for model_id, model in models.items() for name in (model_id, *model.aliases)}
        for task, name in wanted.defaults.models.items():
            model_id = names.get(name)
            tasks = resolved[model_id].tasks if model_id in resolved else self._tasks_of(model_id)
            if task not in tasks:
                raise ConfigError(f"defaults.models.{task.value}: model '{name}' does not do {task.value}")
        return PreparedModels(models, resolved, dict(wanted.defaults.models))

    def apply(self, prepared: PreparedModels, diff: ConfigDiff) -> None:
        """Make the pool serve `prepared` (checked by `prepare` against the same diff)."""
        models = prepared.models
        for model_id in diff.removed:
            self._retire(self._slots.pop(model_id))
        for model_id in diff.added:
            assert self.new_slot is not None  # prepare refused otherwise
            self._slots[model_id] = self.new_slot(models[model_id], prepared.resolved[model_id])
        now = self.clock.monotonic()
        for change in diff.hot:
            slot = self._slots[change.id]
            slot.retune(models[change.id], self._hot_capabilities(slot, models[change.id]))
            if change.id in self._pending:  # a reload still waiting takes the hot change with it
                self._pending[change.id] = self._pending[change.id].replaced(models[change.id],
                                                                             prepared.resolved[change.id])  # fmt: skip
        for change in diff.reloading:
            earlier = self._pending.get(change.id)
            config, capabilities = models[change.id], prepared.resolved[change.id]
            # Waiting since the first reload it missed: reloads in a row do not restart the wait.
            self._pending[change.id] = (earlier.replaced(config, capabilities) if earlier is not None
                                        else PendingReload(config, capabilities, now))  # fmt: skip
        self._configured = dict(models)
        self._names = {name: self._slots[model_id] for model_id, model in models.items()
                       for name in (model_id, *model.aliases)}  # fmt: skip
        self._default_models = prepared.default_models
        for model_id in diff.added:
            if models[model_id].preload:
                self._in_background(self._slots[model_id].ensure_ready(None, explicit=True), f"preload-{model_id}")
        self._in_background(self.apply_pending(), "reload-pending")

    async def apply_pending(self) -> list[str]:
        """Reload every model with a pending config that is idle now (no request running or
        waiting, not loading), or busy past `reload_wait_s` (drained: its running requests
        finish, those waiting load it again with the new config); a model that was loaded
        (or preloads) loads again with it. Returns their ids. The reaper calls this on every
        round."""
        started = []
        now = self.clock.monotonic()
        for model_id, pending in list(self._pending.items()):
            slot = self._slots.get(model_id)
            if slot is None or self._closing or (slot.busy and now - pending.since < self.reload_wait_s):
                continue
            del self._pending[model_id]  # before any await: a concurrent call skips it
            config, capabilities = pending.config, pending.capabilities
            reload_now = slot.holds_memory() or config.preload
            log.info("model reloading with its new config",
                     extra={"model": model_id, "drained_busy": slot.busy})  # fmt: skip
            await slot.reconfigure(config, capabilities)
            slot.forgive_crashes()
            if reload_now:
                self._in_background(slot.ensure_ready(None, explicit=True), f"reload-{model_id}")
            started.append(model_id)
        return started

    def pending_reloads(self) -> list[str]:
        """Models whose new config waits for their next idle moment."""
        return sorted(self._pending)

    def resident_slots(self) -> list[ModelSlot]:
        """Every slot that may hold memory: the served ones and those a reload removed that
        are still draining (what capacity counts)."""
        return [*self._slots.values(), *self._retiring]

    async def finish_reloads(self) -> None:
        """At close: the removed models drained and unloaded, the reloads' loads ended."""
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*(slot.unload() for slot in list(self._retiring)), return_exceptions=True)

    def _retire(self, slot: ModelSlot) -> None:
        """Out of the names at once (new requests get model_not_found, and so do those still
        in its line: `ModelSlot.retire`); its requests running finish, then it unloads and is
        gone. Retired, it cannot load again, so once unloaded it holds nothing."""
        self._pending.pop(slot.id, None)
        slot.retire()
        self._retiring.add(slot)

        async def drain() -> None:
            try:
                await slot.unload(drain=True)
                log.info("removed model drained and unloaded", extra={"model": slot.id})
            finally:
                self._retiring.discard(slot)

        self._in_background(drain(), f"retire-{slot.id}")

    def _hot_capabilities(self, slot: ModelSlot, wanted: ModelConfig) -> ModelCapabilities:
        """What `slot` does with `wanted`'s hot settings (`enable_thinking`, `reasoning_parser`
        change its thinking modes), checked by `prepare` against the slot's settings then;
        should a waiting reload have applied since, they resolve as `wanted` did."""
        try:
            return self._resolve(with_hot_fields(slot.config, wanted))
        except ConfigError:  # not reached (prepare checked both); apply must not fail half-way
            log.exception("model %s keeps its capabilities", slot.id)
            return slot.capabilities

    def _tasks_of(self, model_id: str | None) -> frozenset[Task]:
        slot = self._slots.get(model_id or "")
        return slot.tasks if slot is not None else frozenset()

    def _in_background(self, work: Coroutine[Any, Any, object], name: str) -> None:
        task = detached_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a load's failure stays on its slot
            log.debug("reload task %s ended with %r", task.get_name(), task.exception())
