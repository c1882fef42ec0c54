"""Admission: who runs now, who waits (FIFO, bounded), who is turned away at once.

A model with N replicas of `max_concurrency` C has N×C turns and N×`max_queue` places in
one shared queue. One queue in front of all replicas (rather than one per replica) means
no request waits behind a slow one while another replica is free.
"""

from __future__ import annotations

import asyncio
from collections import deque

from modelpool.errors import Overloaded


class Ticket:
    """A place in line. `wait_turn()` returns once it is this request's turn to run."""

    def __init__(self, admission: Admission, turn: asyncio.Future[None]) -> None:
        self._admission = admission
        self._turn = turn
        self._done = False

    async def wait_turn(self) -> None:
        await asyncio.shield(self._turn)

    def done(self) -> None:
        """Give the turn (or the place in line) back. Safe to call twice, and on cancellation."""
        if self._done:
            return
        self._done = True
        self._admission._leave(self._turn)


class Admission:
    def __init__(self, *, turns: int, queue: int, model_id: str) -> None:
        self.turns = turns
        self.queue = queue
        self.model_id = model_id
        self.running = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, retry_after_s: float = 1.0) -> Ticket:
        """A ticket, or Overloaded at once when the queue is full (before any work is done)."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.running < self.turns and not self._waiting:
            self.running += 1
            turn.set_result(None)
        elif len(self._waiting) >= self.queue:
            raise Overloaded(
                f"model '{self.model_id}' is busy: {self.running} running and {len(self._waiting)} waiting "
                f"(max_queue); retry shortly",
                retry_after_s=retry_after_s,
            )
        else:
            self._waiting.append(turn)
        return Ticket(self, turn)

    def resize(self, turns: int, queue: int) -> None:
        """New limits (replicas added or removed); waiting requests get any new turns."""
        self.turns, self.queue = turns, queue
        self._hand_out()

    def _leave(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            self.running -= 1
        else:
            turn.cancel()
            if turn in self._waiting:
                self._waiting.remove(turn)
        self._hand_out()

    def _hand_out(self) -> None:
        while self._waiting and self.running < self.turns:
            self.running += 1
            self._waiting.popleft().set_result(None)
