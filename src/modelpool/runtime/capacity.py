"""Room for a load: the pool's budget, and the eviction that makes room (CapacityGate).

Decisions are serialised by one lock, and a load that was granted its room counts as
resident (and busy) with its estimate from then on, so two loads never both think the same
room is free. A load still waiting for room counts for nothing (two such loads waiting for
each other would wait forever), and gives up when the server shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from modelpool.errors import InsufficientCapacity, LoadAbandoned, ShuttingDown
from modelpool.runtime.eviction import Budget, Need, Resident, Swap, decide_swap
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.slot import ModelSlot

log = logging.getLogger("modelpool.runtime")
MiB = 1024 * 1024
SWAP_POLL_S = 0.05
"""How often a pending swap looks again whether the busy models in its way went idle."""
DEFAULT_SWAP_AFTER_S = 10.0


class Capacity:
    def __init__(
        self,
        budget: Budget,
        slots: Callable[[], list[ModelSlot]],
        accounts: MemoryAccounts | None = None,
        *,
        swap_after_s: float = DEFAULT_SWAP_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = budget
        self.swap_after_s = swap_after_s
        """How long a load waits for busy models in its way before it drains them."""
        self._clock = clock
        """The whole budget: with `accounts`, the process's baseline and runtimes count in it."""
        self.accounts = accounts
        self.budget_from = ("", "")
        """How the RAM and GPU budgets were reached, for people ("75% of 23.5 GiB of RAM")."""
        self._slots = slots
        self._room = asyncio.Lock()
        self._abandoned: dict[str, tuple[float, float]] = {}
        """Per model, when its abandoned load began to wait for room and when it stopped: a
        load asked again soon after goes on from there, so a client that keeps asking and
        leaving still gets its swap after `swap_after_s` of asking."""

    def models_budget(self) -> Budget:
        """What the models may use: the budget less what the process holds before any model
        (its baseline and runtimes; on the GPUs, what was in use at start), so what the
        budget admits really fits."""
        if self.accounts is None:
            return self.budget
        overhead = self.accounts.overhead()
        ram, gpu = self.budget.memory_bytes, self.budget.gpu_bytes
        return Budget(
            self.budget.max_models,
            None if ram is None else max(0, ram - overhead.ram_bytes),
            None if gpu is None else max(0, gpu - overhead.gpu_bytes),
        )

    async def make_room(self, slot: ModelSlot, need: Need) -> None:
        """Unload least recently used idle models until `need` fits; while the models in the
        way are busy, wait for them (they serve their own requests first) up to
        `swap_after_s`, then drain them (`eviction.decide_swap`). InsufficientCapacity when
        nothing could make room; LoadAbandoned when no request waits for the load any more
        and room would cost another model (a request asking again resumes the wait)."""
        started = self._wait_began(slot.id)
        try:
            await self._make_room(slot, need, started)
        except LoadAbandoned:
            self._abandoned[slot.id] = (started, self._clock())
            raise

    def _wait_began(self, model_id: str) -> float:
        now = self._clock()
        earlier = self._abandoned.pop(model_id, None)
        if earlier is not None and now - earlier[1] <= self.swap_after_s:
            return earlier[0]
        return now

    async def _make_room(self, slot: ModelSlot, need: Need, started: float) -> None:
        while True:
            if slot.closing:
                raise ShuttingDown(f"the server is shutting down: model '{slot.id}' will not load")
            async with self._room:
                others = {s.id: s for s in self._slots() if s is not slot and s.holds_memory()}
                residents = [s.as_resident() for s in others.values()]
                waited = self._clock() - started
                decision = decide_swap(need, residents, self.models_budget(), waited, self.swap_after_s)
                if decision.action is Swap.REFUSE:
                    raise InsufficientCapacity(self._refusal(slot, need, residents))
                if (decision.victims or decision.action is Swap.WAIT) and not slot.wanted():
                    # Its requests all left (timed out, disconnected): another model would go,
                    # or a busy one be drained, for nobody; the next request loads it again.
                    raise LoadAbandoned(f"model '{slot.id}' stopped loading before making room: no request "
                                        "waits for it any more; retry")  # fmt: skip
                if decision.action is Swap.EVICT:
                    for victim in decision.victims:
                        await self._evict(others[victim], slot, waited)
                    return
            await asyncio.sleep(SWAP_POLL_S)  # the lock is free meanwhile: other loads go on

    async def _evict(self, victim: ModelSlot, wanted: ModelSlot, waited_s: float) -> None:
        # A busy victim (past swap_after_s) is drained: its running requests finish first.
        extra = {"model": victim.id, "for_model": wanted.id, "drained_busy": victim.busy, "waited_s": waited_s}
        log.info("evicting model to make room", extra=extra)
        await victim.unload()

    def weights_room(self) -> int | None:
        """RAM and GPU budgets together, less what the process holds before any model:
        weights must fit in one or the other (None: RAM unlimited)."""
        budget = self.models_budget()
        if budget.memory_bytes is None:
            return None
        return budget.memory_bytes + (budget.gpu_bytes or 0)

    def _refusal(self, slot: ModelSlot, need: Need, residents: list[Resident]) -> str:
        loaded = ", ".join(
            f"{r.id} ({r.memory_bytes // MiB} MiB{', busy' if r.busy else ''}{', pinned' if r.pinned else ''})"
            for r in residents
        ) or "nothing"  # fmt: skip
        limits = []
        if self.budget.max_models is not None:
            limits.append(f"max_loaded_models={self.budget.max_models}")
        models = self.models_budget()
        if self.budget.memory_bytes is not None and models.memory_bytes is not None:
            limits.append(
                f"memory budget {self.budget.memory_bytes // MiB} MiB, {models.memory_bytes // MiB} MiB of it for "
                "models after the process's baseline and runtimes"
            )
        if self.budget.gpu_bytes is not None and models.gpu_bytes is not None:
            limits.append(
                f"GPU budget {self.budget.gpu_bytes // MiB} MiB, {models.gpu_bytes // MiB} MiB of it for models"
            )
        return (
            f"cannot load model '{slot.id}': it needs {need.memory_bytes // MiB} MiB"
            f"{f' and {need.gpu_bytes // MiB} MiB of GPU memory' if need.gpu_bytes else ''} and the pool "
            f"({', '.join(limits)}) cannot make room; loaded: {loaded}"
        )
