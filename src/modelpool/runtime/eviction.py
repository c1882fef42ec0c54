"""Which loaded models to unload so that another fits: pure functions, tested with tables.

`choose_victims` rules: never a busy model (running or queued work), never a pinned one;
least recently used first; as few as needed. If even unloading every candidate cannot make
room, the answer is None.

`decide_swap` adds the anti-thrash rule on top (llama-swap's): a model with work running or
waiting is not thrown out for a load of another model. The load waits (a *pending swap*)
while the resident model keeps serving its own requests first, and goes ahead once that
model is idle. Only when the load has waited `swap_after_s` is the busy model drained (its
running requests finish, its waiting ones load it again later): then the memory is truly
needed and its queue has had its bound. A model that is loading or unloading is never
drained (it is waited for); a pinned one never goes. When even all of that cannot make room
the load is refused at once (503 insufficient_capacity).

A load still waiting for its room (not `granted`) holds nothing and is not in anyone's way:
two loads that cannot both fit never wait for each other. Whichever is decided first gets
the room; the other then waits for it as for any resident model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class Resident:
    """A model that holds memory now (loaded or loading)."""

    id: str
    memory_bytes: int
    last_used: float
    busy: bool = False
    pinned: bool = False
    gpu_bytes: int = 0
    changing: bool = False
    """Loading or unloading: busy, and never drained (its memory is waited for)."""
    granted: bool = True
    """False for a load not yet granted its room: it holds no memory and is no one's obstacle."""


@dataclass(frozen=True)
class Budget:
    max_models: int | None = None
    memory_bytes: int | None = None
    gpu_bytes: int | None = None


@dataclass(frozen=True)
class Need:
    memory_bytes: int
    gpu_bytes: int = 0
    new_model: bool = True
    """False when adding a replica of a model that is already resident."""


class Swap(str, Enum):
    EVICT = "evict"
    """Unload `victims` (drained if busy), then load: [] when it fits already."""
    WAIT = "wait"
    """A pending swap: the residents in the way are busy; ask again when they may be idle."""
    REFUSE = "refuse"
    """It cannot fit whatever goes."""


@dataclass(frozen=True)
class SwapDecision:
    action: Swap
    victims: list[str] = field(default_factory=list)


def decide_swap(
    need: Need, residents: Sequence[Resident], budget: Budget, waited_s: float, swap_after_s: float
) -> SwapDecision:
    """What a load that has waited `waited_s` for room does now (see the module's rules)."""
    residents = [r for r in residents if r.granted]
    idle = choose_victims(need, residents, budget)
    if idle is not None:
        return SwapDecision(Swap.EVICT, idle)
    drained = choose_victims(need, residents, budget, drain=True)
    if drained is not None and waited_s >= swap_after_s:
        return SwapDecision(Swap.EVICT, drained)
    if drained is not None or _fits_once_settled(need, residents, budget):
        return SwapDecision(Swap.WAIT)
    return SwapDecision(Swap.REFUSE)


def _fits_once_settled(need: Need, residents: Sequence[Resident], budget: Budget) -> bool:
    """Whether it would fit with every unpinned model gone, those changing state included."""
    return fits(need, [r for r in residents if r.pinned], budget)


def choose_victims(
    need: Need, residents: Sequence[Resident], budget: Budget, *, drain: bool = False
) -> list[str] | None:
    """Ids to unload (LRU idle unpinned first) so that `need` fits; [] if it fits already.
    drain: busy models (not changing state) may go too, after every idle one."""
    remaining = list(residents)
    candidates = sorted(
        (r for r in residents if not r.pinned and (not r.busy or (drain and not r.changing))),
        key=lambda r: (r.busy, r.last_used),
    )
    victims: list[str] = []
    while not fits(need, remaining, budget):
        if not candidates:
            return None
        victim = candidates.pop(0)
        victims.append(victim.id)
        remaining.remove(victim)
    return victims


def fits(need: Need, residents: Sequence[Resident], budget: Budget) -> bool:
    if budget.max_models is not None and len(residents) + int(need.new_model) > budget.max_models:
        return False
    memory = sum(r.memory_bytes for r in residents) + need.memory_bytes
    if budget.memory_bytes is not None and memory > budget.memory_bytes:
        return False
    return budget.gpu_bytes is None or sum(r.gpu_bytes for r in residents) + need.gpu_bytes <= budget.gpu_bytes
