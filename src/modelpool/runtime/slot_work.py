"""What a slot keeps beside its state: the pool's capacity gate it asks for room, the record
its loads leave, and its background tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from modelpool.backends.base import MemoryEstimate
from modelpool.runtime.detached import detached_task
from modelpool.runtime.eviction import Need

if TYPE_CHECKING:
    from modelpool.runtime.slot import ModelSlot


class CapacityGate(Protocol):
    async def make_room(self, slot: ModelSlot, need: Need) -> None:
        """Unload what must go so that `need` fits, or raise InsufficientCapacity."""

    def weights_room(self) -> int | None:
        """The most bytes of weights the pool could ever hold (None: no limit): a model whose
        download is bigger is refused before it starts."""


class NoLimits:
    async def make_room(self, slot: ModelSlot, need: Need) -> None:
        return None

    def weights_room(self) -> int | None:
        return None


@dataclass
class LoadRecord:
    """What the last load and the last failure left behind."""

    error: str | None = None
    failed_at: float | None = None
    loaded_at: float | None = None
    """Wall-clock time the model became ready."""
    load_seconds: float | None = None
    estimate: MemoryEstimate | None = None
    """Per replica, from the backend before loading (or from `memory_bytes`)."""


class SlotTasks:
    """The slot's background work: the load and unload in flight, a crash cleanup, and
    fire-and-forget tasks (the loop keeps only weak references to tasks)."""

    def __init__(self) -> None:
        self.load: asyncio.Task[None] | None = None
        self.unload: asyncio.Task[None] | None = None
        self.cleanup: asyncio.Task[None] | None = None
        self.closing = False
        """The server is shutting down: no new requests; persistent engines are detached."""
        self.retired = False
        """A config reload removed the model: no new requests, no load again."""
        self.asked_explicitly = False
        """The load under way was asked for by an admin, a preload or a reload, not only by
        requests: it goes on when no request waits for it."""
        self._background: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> None:
        task = detached_task(work, name=name)  # outside the request that may have started it
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def finish_cleanup(self) -> None:
        if self.cleanup is not None:
            await asyncio.gather(self.cleanup, return_exceptions=True)
            self.cleanup = None
