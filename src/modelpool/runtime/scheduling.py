"""The order of a model's queue: priority classes, aging, and fair shares between callers.

Pure bookkeeping (no event loop, no clock of its own), tested with tables.

- **Classes**: `high` before `normal` before `low`, strictly — except that waiting ages a
  request: after each `aging_s` in line it competes one class higher (low → normal after
  `aging_s`, → high after 2×`aging_s`). Between equal effective classes the earlier arrival
  goes first, so a low request waits at most about 2×`aging_s` plus the high work that
  arrived before it: nothing starves forever. Every caller's first waiting request competes
  with its own age (not only its class's fair-share head: a fresh caller's request would
  be that head, unaged, and keep older ones of its class stuck), and aged requests go in
  arrival order, ahead of their class's fair order.
- **Fair shares inside a class**: start-time fair queueing over one FIFO per party (a key,
  or an address without keys). A request's start tag is max(the class's virtual time, its
  party's last finish tag); its finish tag adds size/weight. The smallest start tag goes
  next and sets the class's virtual time. A party that queued a hundred requests holds tags
  far in the future; a party arriving now starts at the present, so it is served next —
  and two busy parties alternate in proportion to their weights. A party whose FIFO empties
  is forgotten (its next request starts at the present: no credit is saved up while idle).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from modelpool.owner import Priority, Schedule

MAX_RANK = Priority.HIGH.rank


@dataclass(eq=False)
class Entry:
    """One waiting request, as the scheduler sees it."""

    schedule: Schedule
    size: int
    arrived: float
    seq: int = 0
    start: float = 0.0
    """Start tag in its class's virtual time."""


def effective_rank(entry: Entry, now: float, aging_s: float) -> int:
    """The class a waiting request competes in now: its own, one higher per `aging_s` waited."""
    aged = int(max(0.0, now - entry.arrived) // aging_s) if aging_s > 0 else 0
    return min(MAX_RANK, entry.schedule.priority.rank + aged)


@dataclass
class _Party:
    queue: deque[Entry] = field(default_factory=deque)
    finish: float = 0.0


@dataclass
class _Class:
    virtual_time: float = 0.0
    parties: dict[str, _Party] = field(default_factory=dict)

    def head(self, now: float, aging_s: float) -> Entry | None:
        """The next of this class: the most aged of its parties' first requests; among
        unaged ones the smallest start tag (fair shares), among aged ones the earliest
        arrival (the aging bound). Then the earliest arrival."""

        def order(entry: Entry) -> tuple[int, float, int]:
            rank = effective_rank(entry, now, aging_s)
            aged = rank > entry.schedule.priority.rank
            return -rank, float(entry.seq) if aged else entry.start, entry.seq

        heads = (party.queue[0] for party in self.parties.values())
        return min(heads, key=order, default=None)


class FairQueue:
    """Waiting requests of one model, in the order they get turns."""

    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._classes = {p: _Class() for p in Priority}
        self._seq = itertools.count()
        self._count = 0
        self._per_party: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def held_by(self, party: str) -> int:
        """Places the party holds in line (all its classes together)."""
        return self._per_party.get(party, 0)

    def depth(self, priority: Priority) -> int:
        """Requests waiting in one class (by their own class, not the aged one)."""
        return sum(len(p.queue) for p in self._classes[priority].parties.values())

    def push(self, entry: Entry) -> None:
        cls = self._classes[entry.schedule.priority]
        party = cls.parties.setdefault(entry.schedule.party, _Party())
        entry.seq = next(self._seq)
        entry.start = max(cls.virtual_time, party.finish)
        party.finish = entry.start + entry.size / max(1, entry.schedule.weight)
        party.queue.append(entry)
        self._count += 1
        self._per_party[entry.schedule.party] = self.held_by(entry.schedule.party) + 1

    def peek(self, now: float) -> Entry | None:
        """The request that goes next: the class heads compete by effective class, then arrival."""
        heads = [h for h in (c.head(now, self.aging_s) for c in self._classes.values()) if h is not None]
        return min(heads, key=lambda e: (-effective_rank(e, now, self.aging_s), e.seq), default=None)

    def pop(self, entry: Entry) -> None:
        """`entry` got its turn: its class's virtual time moves to its start tag."""
        cls = self._classes[entry.schedule.priority]
        cls.virtual_time = max(cls.virtual_time, entry.start)
        self.remove(entry)

    def remove(self, entry: Entry) -> None:
        """`entry` leaves the line (its turn, or its caller gave up)."""
        cls = self._classes[entry.schedule.priority]
        party = cls.parties.get(entry.schedule.party)
        if party is None or entry not in party.queue:
            return
        party.queue.remove(entry)
        if not party.queue:
            del cls.parties[entry.schedule.party]
        self._count -= 1
        left = self.held_by(entry.schedule.party) - 1
        if left:
            self._per_party[entry.schedule.party] = left
        else:
            del self._per_party[entry.schedule.party]


def party_cap(queue: int, per_key: int | None) -> int:
    """Places one party may hold in a queue of `queue`: `per_key` when set (at most the
    queue), else three quarters of it rounded up, so a flooding caller always leaves room
    for others (a queue of 1 or 2 is the one caller's whole)."""
    if per_key is not None:
        return min(queue, per_key)
    return -(-queue * 3 // 4)
