"""The pool's models, found by id or alias, and the one way onto a model's turn (task check
→ keep-alive check → lease); the pool's operations are built on it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from modelpool.backends.base import (
    Backend,
)
from modelpool.capabilities import ModelCapabilities
from modelpool.config.schema import ModelConfig
from modelpool.errors import (
    InvalidRequest,
    ModelNotFound,
    RemoteNotAllowed,
    UnsupportedTask,
)
from modelpool.media.images import ImagePolicy
from modelpool.media.video import VideoPolicy
from modelpool.pool_api.call import DEFAULT_CALL, CallOptions
from modelpool.pool_api.results import Outcome
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.adapters import split_adapter
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.clock import Clock
from modelpool.runtime.eviction import Budget
from modelpool.runtime.keep_alive import check_keep_alive
from modelpool.runtime.lease import Lease
from modelpool.runtime.metrics.observers import RequestObservers
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.slot import ModelSlot
from modelpool.runtime.tasks.audio_budget import AudioBudget
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")
B = TypeVar("B", bound=Backend)
R = TypeVar("R", bound="_Counted")


class _Counted(Protocol):
    """A result that says how many prompt tokens it took."""

    @property
    def prompt_tokens(self) -> int: ...


@dataclass(frozen=True)
class PendingReload:
    """A model's new settings waiting for its next idle moment, and since when."""

    config: ModelConfig
    capabilities: ModelCapabilities
    since: float

    def replaced(self, config: ModelConfig, capabilities: ModelCapabilities) -> PendingReload:
        return PendingReload(config, capabilities, self.since)


class PoolBase:
    """The pool's models and the one way onto a model's turn; the request, admin and
    lifetime operations (`ModelPool`) are built on it."""

    def __init__(
        self,
        slots: list[ModelSlot],
        metrics: Metrics,
        capacity: Capacity,
        clock: Clock,
        *,
        model_wait_s: float | None,
        resolve: Callable[[ModelConfig], ModelCapabilities],
        reap_interval_s: float = 1.0,
        reload_wait_s: float = 60.0,
        images: ImagePolicy | None = None,
        videos: VideoPolicy | None = None,
        max_audio_seconds: float | None = None,
        audio_budget_s: float | None = None,
        default_models: dict[Task, str] | None = None,
    ) -> None:
        """`resolve(config)` gives a config's capabilities (checking its options): admin
        overrides are checked with it before they replace a model's settings."""
        self.metrics = metrics
        self.model_wait_s = model_wait_s
        self.capacity = capacity
        self.clock = clock
        self.observe = RequestObservers(metrics, clock)
        self.reap_interval_s = reap_interval_s
        self.reload_wait_s = reload_wait_s
        """How long a changed model may stay busy on its old config before it is drained."""
        self.images = images or ImagePolicy()
        """Where images in requests may come from, and their limits."""
        self.videos = videos or VideoPolicy()
        """Where videos in requests may come from, and their limits."""
        self.max_audio_seconds = max_audio_seconds
        """Longest audio one transcription may decode to (None: no limit)."""
        self.audio_budget = AudioBudget(audio_budget_s) if audio_budget_s is not None else None
        """Decoded audio all transcriptions may hold at once (None: no limit)."""
        self._resolve = resolve
        self._slots = {slot.id: slot for slot in slots}
        self._configured = {slot.id: slot.config for slot in slots}
        """Each model as the config file says, before any override: what overrides may not widen."""
        self._names = {name: slot for slot in slots for name in [slot.id, *slot.config.aliases]}
        self._tasks: list[asyncio.Task[Any]] = []
        self._pending: dict[str, PendingReload] = {}
        """A config reload's new settings for a model, waiting for its next idle moment (`pool_reload`)."""
        self._retiring: set[ModelSlot] = set()
        """Models a config reload removed that are still draining."""
        self._background: set[asyncio.Task[Any]] = set()
        """A config reload's work in flight: drains, preloads, reloads."""
        self._closing = False
        self._default_models = dict(default_models or {})
        for task, name in self._default_models.items():  # the config checked names; this, what each model does
            self.slot_for(name, task)

    @property
    def closing(self) -> bool:
        """Closing or closed: new work is refused."""
        return self._closing

    @property
    def budget(self) -> Budget:
        return self.capacity.budget

    # ----- lookup --------------------------------------------------------------------

    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def slot(self, name: str) -> ModelSlot:
        try:
            return self._names[name]
        except KeyError:
            raise ModelNotFound(name, list(self._slots)) from None

    def model_id(self, name: str) -> str:
        """The canonical id of the model `name` names (an id, an alias, or `base:adapter`)."""
        return self.slot(split_adapter(self._names, name, None)[0]).id

    def model_for(self, name: str | None, task: Task) -> str:
        """The model a request for `task` uses: the one it names; else the server's default
        for the task (`defaults.models`); else the only model that does the task. With
        several and no default, a 400 naming them: the request must choose."""
        if name is not None:
            return name
        if task in self._default_models:
            return self._default_models[task]
        able = [slot.id for slot in self._slots.values() if task in slot.tasks]
        if len(able) == 1:
            return able[0]
        if not able:
            raise InvalidRequest(f"no served model does {task.value}", param="model")
        raise InvalidRequest(
            f"name the model in `model`: several models do {task.value} and no default is configured "
            f"(defaults.models.{task.value}); candidates: {', '.join(able)}",
            param="model",
        )

    def slot_for(self, name: str, task: Task, options: CallOptions = DEFAULT_CALL) -> ModelSlot:
        """The slot that serves `name` for `task`, once the request may use it."""
        slot = self.slot(name)
        if task not in slot.tasks:
            can = ", ".join(sorted(t.value for t in slot.tasks))
            raise UnsupportedTask(f"model '{slot.id}' does not do {task.value} (it does: {can})", param="model")
        if slot.capabilities.remote and not (options.allow_remote or slot.config.allow_remote):
            raise RemoteNotAllowed(
                f"model '{slot.id}' is served by a remote upstream; send `allow_remote: true` with the request "
                "(or set `allow_remote: true` on the model) to use it",
                param="allow_remote",
            )
        check_keep_alive(options, slot.config)
        return slot

    def metrics_label(self, name: str) -> str:
        """The model label for metrics: the canonical id, or "unknown" so that clients cannot
        grow the label set without bound by inventing model names."""
        slot = self._names.get(name) or self._names.get(name.rpartition(":")[0])  # `base:adapter`: the base
        return slot.id if slot is not None else "unknown"

    # ----- requests ------------------------------------------------------------------

    async def lease(
        self, name: str, task: Task, protocol: type[B], options: CallOptions = DEFAULT_CALL, *, size: int = 1
    ) -> Lease[B]:
        """A turn on a ready replica of the model `name` names, for `task` (whose Protocol
        is `protocol`), `size` turns for a batch run at once. Leave it with `async with`, or
        hand it to a stream."""
        slot = self.slot_for(name, task, options)
        return await slot.lease(protocol, self.model_wait_s, options.keep_alive, size=size, schedule=options.schedule)

    async def _timed(
        self,
        slot: ModelSlot,
        protocol: type[B],
        options: CallOptions,
        size: int,
        run: Callable[[Lease[B]], Awaitable[R]],
    ) -> Outcome[R]:
        """`run` on `size` turns of the model (its inputs go into the engine at once), timed
        and counted (the result's `prompt_tokens`)."""
        usage = RequestUsage()
        async with await slot.lease(
            protocol, self.model_wait_s, options.keep_alive, size=size, schedule=options.schedule
        ) as lease:
            try:
                result = await run(lease)
                lease.timing.prompt_tokens = result.prompt_tokens  # before the turn's span ends with it
            finally:
                lease.timing.backend_s = self.clock.monotonic() - lease.timing.started
        self.observe.ended(slot.id, lease.timing, usage)
        return Outcome(result, lease.timing, usage)
