"""Which loaded models to unload so that another fits: a pure function, tested with tables.

Rules: never a busy model (running or queued work), never a pinned one; least recently
used first; as few as needed. If even unloading every candidate cannot make room, the
answer is None and the caller refuses the load (503 insufficient_capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    """A model that holds memory now (loaded or loading)."""

    id: str
    memory_bytes: int
    last_used: float
    busy: bool = False
    pinned: bool = False
    gpu_bytes: int = 0


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


def choose_victims(need: Need, residents: Sequence[Resident], budget: Budget) -> list[str] | None:
    """Ids to unload (LRU idle unpinned first) so that `need` fits; [] if it fits already."""
    remaining = list(residents)
    candidates = sorted((r for r in residents if not r.busy and not r.pinned), key=lambda r: r.last_used)
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
