"""Admission: who runs now, who waits (FIFO, bounded), who is turned away at once.

A model with N replicas of `max_concurrency` C has N×C turns and N×`max_queue` places in
one shared queue. One queue in front of all replicas (rather than one per replica) means
no request waits behind a slow one while another replica is free.

A turn is one sequence the engine runs at a time. A request that runs several at once (a
`/generate` batch, a list of embedding inputs) takes as many turns as it runs — at most
all of them, so any batch can be served: a batch cannot slip many requests' worth of work
past the concurrency limit as one. While it waits it holds one place, as any request does:
`max_queue` bounds the requests in line (what they hold is bounded by the body limits), so
sixteen clients each embedding a list still queue as sixteen requests.
Turns go out strictly in arrival order, so a big batch at the head is never starved by
small requests behind it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from modelpool.errors import Overloaded


@dataclass(eq=False)
class _Place:
    turn: asyncio.Future[None]
    size: int
    """Sequences the request runs at once, as asked (capped by the turns when it is let in)."""
    turns: int = 0
    """Turns it holds once let in."""


class Ticket:
    """A place in line. `wait_turn()` returns once it is this request's turn to run."""

    def __init__(self, admission: Admission, place: _Place) -> None:
        self._admission = admission
        self._place = place
        self._done = False

    @property
    def turns(self) -> int:
        """Turns this request holds (0 while it waits)."""
        return self._place.turns

    async def wait_turn(self) -> None:
        await asyncio.shield(self._place.turn)

    def done(self) -> None:
        """Give the turns (or the place in line) back. Safe to call twice, and on cancellation."""
        if self._done:
            return
        self._done = True
        self._admission._leave(self._place)


class Admission:
    def __init__(self, *, turns: int, queue: int, model_id: str) -> None:
        self.turns = turns
        self.queue = queue
        self.model_id = model_id
        self.running = 0
        """Turns in use."""
        self._waiting: deque[_Place] = deque()

    @property
    def waiting(self) -> int:
        """Requests in line."""
        return len(self._waiting)

    def admit(self, retry_after_s: float = 1.0, *, size: int = 1) -> Ticket:
        """A ticket for a request that runs `size` sequences at once, or Overloaded at once
        when the queue has no room for it (before any work is done)."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        place = _Place(turn, max(1, size))
        if not self._waiting and self.running + self._turns_for(place) <= self.turns:
            self._let_in(place)
        elif len(self._waiting) >= self.queue:
            raise Overloaded(
                f"model '{self.model_id}' is busy: {self.running} turns running and {len(self._waiting)} "
                f"requests waiting (max_queue); retry shortly",
                retry_after_s=retry_after_s,
            )
        else:
            self._waiting.append(place)
        return Ticket(self, place)

    def resize(self, turns: int, queue: int) -> None:
        """New limits (replicas added or removed); waiting requests get any new turns."""
        self.turns, self.queue = turns, queue
        self._hand_out()

    def _turns_for(self, place: _Place) -> int:
        return min(place.size, max(1, self.turns))

    def _let_in(self, place: _Place) -> None:
        place.turns = self._turns_for(place)
        self.running += place.turns
        place.turn.set_result(None)

    def _leave(self, place: _Place) -> None:
        if place.turn.done() and not place.turn.cancelled():
            self.running -= place.turns
        else:
            place.turn.cancel()
            if place in self._waiting:
                self._waiting.remove(place)
        self._hand_out()

    def _hand_out(self) -> None:
        while self._waiting and self.running + self._turns_for(self._waiting[0]) <= self.turns:
            self._let_in(self._waiting.popleft())
