"""A replica (one started backend of a model) and a lease (one request's hold on one)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from modelpool.backends.base import Backend
from modelpool.runtime.admission import Ticket
from modelpool.runtime.batching import EmbeddingBatcher
from modelpool.runtime.timing import RequestTiming


@dataclass(eq=False)
class Replica:
    index: int
    backend: Backend
    memory_bytes: int = 0
    """Measured: process RSS growth while it started (or the engine process's own RSS)."""
    started_at: float = 0.0
    """Monotonic time it became ready."""
    running: int = 0
    served: int = 0
    batcher: EmbeddingBatcher | None = None
    retiring: bool = False
    """Being scaled away: gets no new requests."""
    idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set while nothing runs on this replica."""

    def __post_init__(self) -> None:
        self.idle.set()


class Lease:
    """An admitted request's turn on one replica. `release()` gives it back, once."""

    def __init__(
        self,
        model_id: str,
        replica: Replica,
        ticket: Ticket,
        timing: RequestTiming,
        keep_alive: float | None,
        on_release: Callable[[Lease], None],
    ) -> None:
        self.model_id = model_id
        self.replica = replica
        self.timing = timing
        self.keep_alive = keep_alive
        self.revoked = False
        """Set by a forced unload: the request must stop at its next step."""
        self._ticket = ticket
        self._on_release = on_release
        self._released = False
        replica.running += 1
        replica.idle.clear()

    @property
    def backend(self) -> Backend:
        return self.replica.backend

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.replica.running -= 1
        self.replica.served += 1
        if self.replica.running == 0:
            self.replica.idle.set()
        self._ticket.done()
        self._on_release(self)
