"""The started backends of one model: starting (with warm-up, measuring and supervision),
routing to the least busy, scaling away, and stopping. The slot decides when; this does it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from modelpool.backends.base import (
    Backend,
    GrowingBackend,
    MemoryEstimate,
    PairScoringBackend,
    PlacedBackend,
    ProcessBackend,
    TokenEmbeddingBackend,
    implements,
)
from modelpool.capabilities import Locality, ModelCapabilities
from modelpool.config.schema import ModelConfig
from modelpool.inference import EncodedPair
from modelpool.runtime.batching import Batcher
from modelpool.runtime.clock import Clock
from modelpool.runtime.gpu_probe import nvml_processes, processes_use
from modelpool.runtime.memory import release_freed_memory
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.services.pids import tree_pids
from modelpool.status import EngineOutput, GpuProcess, ReplicaGpu, ReplicaStatus
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")


@dataclass(eq=False)
class Replica:
    index: int
    backend: Backend
    memory_bytes: int = 0
    """Measured: its share of the process's growth while it started (memory_ledger), or
    the engine process's own RSS."""
    gpu_memory_bytes: int = 0
    """Measured: its share of the GPUs' growth while it started (0 without a GPU)."""
    growth: MemoryEstimate = field(default_factory=lambda: MemoryEstimate(0))
    """What it may still grow by under load, which its load did not measure (a KV cache
    that fills with its batch: `GrowingBackend`); counted on top of the measured use."""
    started_at: float = 0.0
    """Monotonic time it became ready."""
    running: int = 0
    served: int = 0
    batcher: Batcher[list[int]] | None = None
    """Embedding requests of this replica, batched."""
    pair_batcher: Batcher[EncodedPair] | None = None
    """Pair-scoring (rerank) requests of this replica, batched."""
    retiring: bool = False
    """Being scaled away: gets no new requests."""
    revoked: bool = False
    """A forced unload: requests running here stop at their next step (503 model_unloaded)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set while nothing runs on this replica: the one "idle" signal drains wait on."""

    def __post_init__(self) -> None:
        self.idle.set()

    def take(self) -> None:
        self.running += 1
        self.idle.clear()

    def give_back(self) -> None:
        self.running -= 1
        self.served += 1
        if self.running == 0:
            self.idle.set()

    def current_memory(self) -> int:
        """An engine process's RSS now (its KV cache and buffers grow as it serves: the
        budget counts what it holds today), else what this replica's load measured."""
        if implements(self.backend, ProcessBackend):
            self.memory_bytes = self.backend.resident_bytes() or self.memory_bytes
        return self.memory_bytes

    def gpu_use(self, seen: dict[int, GpuProcess] | None = None) -> ReplicaGpu:
        """Its GPU memory now. An engine process (with its children: vLLM's workers, a
        container's processes) is found by PID in NVML's per-process list (`seen`, else read
        now); an in-process model keeps what its load measured (NVML lists one modelpool)."""
        seen = nvml_processes() if seen is None else seen
        if implements(self.backend, ProcessBackend) and self.backend.pid is not None:
            tree = tree_pids(self.backend.pid)
            use = processes_use(tree, seen)
            if use is None:
                return ReplicaGpu(self.index, 0, "none")
            self.gpu_memory_bytes = use.used_bytes
            return ReplicaGpu(self.index, use.used_bytes, "nvml", tuple(p for p in tree if p in seen), use.devices)
        if self.gpu_memory_bytes <= 0:
            return ReplicaGpu(self.index, 0, "none")
        mine = seen.get(os.getpid())
        devices = mine.devices if mine is not None else ()
        return ReplicaGpu(self.index, self.gpu_memory_bytes, "load", (os.getpid(),), devices)

    def status(self) -> ReplicaStatus:
        process = self.backend if implements(self.backend, ProcessBackend) else None
        return ReplicaStatus(
            index=self.index,
            running=self.running,
            served=self.served,
            memory_bytes=self.current_memory(),
            retiring=self.retiring,
            pid=process.pid if process else None,
            port=process.port if process else None,
            placement=self.backend.placement() if implements(self.backend, PlacedBackend) else None,
        )

    def output(self, count: int) -> list[str]:
        """The engine process's last `count` output lines (none for an engine in modelpool)."""
        return self.backend.log_tail(count) if implements(self.backend, ProcessBackend) else []

    async def stop(self, *, detach: bool = False) -> None:
        """Stop the backend, logging (not raising) what goes wrong. detach: modelpool is
        shutting down, and a persistent engine process is left running to be adopted."""
        for batcher in (self.batcher, self.pair_batcher):
            if batcher is not None:
                await batcher.close()
        try:
            if detach and implements(self.backend, ProcessBackend):
                await self.backend.detach()
            else:
                await self.backend.stop()
        except Exception:
            log.exception("stopping a backend failed")


class ReplicaSet:
    def __init__(
        self, model_id: str, clock: Clock, on_crash: Callable[[Replica, str], None], accounts: MemoryAccounts
    ) -> None:
        self.model_id = model_id
        self._accounts = accounts
        self._clock = clock
        self._on_crash = on_crash
        self.members: list[Replica] = []

    def __len__(self) -> int:
        return len(self.members)

    def routable(self) -> list[Replica]:
        return [r for r in self.members if not r.retiring]

    def least_busy(self) -> Replica:
        return min(self.routable(), key=lambda r: r.running)

    def next_index(self) -> int:
        return max((r.index for r in self.members), default=-1) + 1

    async def start(
        self,
        index: int,
        backend: Backend,
        config: ModelConfig,
        capabilities: ModelCapabilities,
        estimate: MemoryEstimate | None = None,
    ) -> Replica:
        """Start `backend` as replica `index` and add it; a failed start leaves nothing behind.
        `estimate` weighs its share of what the process grows by while other loads run too."""
        locality = capabilities.declared.locality
        in_process = locality is Locality.IN_PROCESS and not implements(backend, ProcessBackend)
        windows = self._accounts.open_load(estimate or MemoryEstimate(0), in_process=in_process)
        replica = Replica(index, backend)
        try:
            await backend.start()
            if config.warmup:
                await backend.warmup()
        except BaseException:
            self._accounts.close_load(windows)
            await replica.stop()
            raise
        replica.started_at = self._clock.monotonic()
        measured = self._accounts.close_load(windows)
        replica.memory_bytes, replica.gpu_memory_bytes = measured.ram_bytes, measured.gpu_bytes
        if implements(backend, ProcessBackend):
            replica.memory_bytes = backend.resident_bytes()
            backend.supervise(lambda message: self._on_crash(replica, message))
        if implements(backend, GrowingBackend):
            replica.growth = backend.growth_bound()
        name = f"{self.model_id}#{index}"
        if Task.EMBEDDING in capabilities.tasks and implements(backend, TokenEmbeddingBackend):
            replica.batcher = Batcher(
                backend.embed_tokens, config.batch, name, concurrency=backend.concurrent_batches()
            )
        if Task.RERANK in capabilities.tasks and implements(backend, PairScoringBackend):
            replica.pair_batcher = Batcher(
                backend.score_encoded, config.batch, name, concurrency=backend.concurrent_batches()
            )
        self.members.append(replica)
        return replica

    def revoke_all(self) -> None:
        for replica in self.members:
            replica.revoked = True

    async def wait_idle(self, replicas: list[Replica] | None = None) -> None:
        await asyncio.gather(*(r.idle.wait() for r in (self.members if replicas is None else replicas)))

    async def stop_all(self, *, detach: bool = False) -> None:
        leaving, self.members = self.members, []
        if leaving:
            await self._stop(leaving, detach=detach)

    async def retire(self, leaving: list[Replica]) -> None:
        """Take replicas out of routing, wait until their requests finish, then stop them."""
        for replica in leaving:
            replica.retiring = True
        await self.wait_idle(leaving)
        for replica in leaving:
            self.members.remove(replica)
        await self._stop(leaving)

    async def _stop(self, leaving: list[Replica], *, detach: bool = False) -> None:
        """Stop replicas and hand the freed memory back to the OS, inside a window that
        absorbs what the meters lose meanwhile (freed memory is no load's negative growth)."""
        release = self._accounts.open_release()
        try:
            for replica in leaving:
                await replica.stop(detach=detach)
            release_freed_memory()
        finally:
            self._accounts.close_release(release)

    def measured_bytes(self) -> int:
        return sum(r.current_memory() for r in self.members)

    def growth(self) -> MemoryEstimate:
        """What the replicas may still grow by under load (`Replica.growth`), in all."""
        return MemoryEstimate(
            sum(r.growth.ram_bytes for r in self.members), sum(r.growth.gpu_bytes for r in self.members)
        )

    def measured_gpu_bytes(self) -> int:
        """In-process replicas as their loads measured; engine processes as NVML sees them now."""
        seen = nvml_processes() if any(implements(r.backend, ProcessBackend) for r in self.members) else {}
        return sum(r.gpu_use(seen).measured_bytes for r in self.members)

    def gpu_uses(self, seen: dict[int, GpuProcess]) -> list[ReplicaGpu]:
        return [r.gpu_use(seen) for r in self.members]

    def output(self, count: int) -> list[EngineOutput]:
        """The last output lines of each replica's engine process."""
        return [
            EngineOutput(r.index, r.backend.pid, r.backend.log_tail(count))
            for r in self.members
            if implements(r.backend, ProcessBackend)
        ]

    def statuses(self) -> list[ReplicaStatus]:
        return [r.status() for r in self.members]
