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
Who goes next is `scheduling.FairQueue`'s answer (priority classes with aging, fair shares
between callers inside a class); a big batch that is next waits for enough turns and is
never overtaken by small requests behind it. One caller (a key, or an address without
keys) holds at most `max_queue_per_key` places, so a flood cannot fill the line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from modelpool.errors import Overloaded
from modelpool.owner import DEFAULT_SCHEDULE, Priority, Schedule
from modelpool.runtime.scheduling import Entry, FairQueue, party_cap

DEFAULT_AGING_S = 30.0


@dataclass(eq=False)
class _Place:
    turn: asyncio.Future[None]
    size: int
    """Sequences the request runs at once, as asked (capped by the turns when it is let in)."""
    entry: Entry
    """Its place in the scheduler's order."""
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
    def __init__(
        self,
        *,
        turns: int,
        queue: int,
        model_id: str,
        per_key: int | None = None,
        aging_s: float = DEFAULT_AGING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.turns = turns
        self.queue = queue
        self.per_key = per_key
        """Places one caller may hold (None: three quarters of the queue, see `party_cap`)."""
        self.model_id = model_id
        self.running = 0
        """Turns in use."""
        self._clock = clock
        self._line = FairQueue(aging_s)
        self._places: dict[Entry, _Place] = {}

    @property
    def aging_s(self) -> float:
        """Seconds in line that move a request up one priority class."""
        return self._line.aging_s

    @property
    def waiting(self) -> int:
        """Requests in line."""
        return len(self._line)

    def waiting_in(self, priority: Priority) -> int:
        """Requests in line of one priority class."""
        return self._line.depth(priority)

    def admit(self, retry_after_s: float = 1.0, *, size: int = 1, schedule: Schedule = DEFAULT_SCHEDULE) -> Ticket:
        """A ticket for a request that runs `size` sequences at once, or Overloaded at once
        when the queue (or the caller's share of it) has no room (before any work is done)."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        place = _Place(turn, max(1, size), Entry(schedule, max(1, size), self._clock()))
        if not self._line and self.running + self._turns_for(place) <= self.turns:
            self._let_in(place)
            return Ticket(self, place)
        self._check_room(schedule, retry_after_s)
        self._places[place.entry] = place
        self._line.push(place.entry)
        return Ticket(self, place)

    def _check_room(self, schedule: Schedule, retry_after_s: float) -> None:
        if len(self._line) >= self.queue:
            raise Overloaded(
                f"model '{self.model_id}' is busy: {self.running} turns running and {len(self._line)} "
                f"requests waiting (max_queue); retry shortly",
                retry_after_s=retry_after_s,
            )
        held = self._line.held_by(schedule.party)
        if held >= party_cap(self.queue, self.per_key):
            raise Overloaded(
                f"model '{self.model_id}' is busy: this caller already has {held} requests waiting "
                f"(max_queue_per_key); retry shortly",
                retry_after_s=retry_after_s,
            )

    def resize(self, turns: int, queue: int, per_key: int | None, aging_s: float) -> None:
        """New limits (replicas added or removed, or a config reload); waiting requests get
        any new turns, and age at the new pace from now on."""
        self.turns, self.queue, self.per_key = turns, queue, per_key
        self._line.aging_s = aging_s
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
            if self._places.pop(place.entry, None) is not None:
                self._line.remove(place.entry)
        self._hand_out()

    def _hand_out(self) -> None:
        now = self._clock()
        while (entry := self._line.peek(now)) is not None:
            place = self._places[entry]
            if self.running + self._turns_for(place) > self.turns:
                return  # the next in line waits for enough turns: nobody overtakes it
            self._line.pop(entry)
            del self._places[entry]
            self._let_in(place)
