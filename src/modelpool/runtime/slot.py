"""A model slot: one configured model, its replicas and its load state.

    unloaded ──ensure_ready()──► loading ──► ready ──unload()──► unloading ──► unloaded
                                    │          └──(engine process crashed)──► failed
                                    └──────► failed ──(after retry_cooldown_s)──► loading
                                                    └──(crash: after restart backoff)──► loading

The slot decides for itself whether a start is needed; callers never read `state` and
then act on it. Concurrent first requests share one load. Making room for a load (which
may unload other models) is asked of the pool through `CapacityGate`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import Protocol

from modelpool.backends.base import Backend, EmbeddingBackend, MemoryEstimate, ProcessBackend
from modelpool.config.schema import ModelConfig
from modelpool.errors import (
    ModelLoadFailed,
    ModelNotLoaded,
    ModelNotReady,
    ModelpoolError,
    ShuttingDown,
)
from modelpool.runtime.admission import Admission
from modelpool.runtime.batching import EmbeddingBatcher
from modelpool.runtime.clock import Clock
from modelpool.runtime.crashes import CrashRecord
from modelpool.runtime.embedding_cache import EmbeddingCache
from modelpool.runtime.eviction import Need, Resident
from modelpool.runtime.memory import process_rss, release_freed_memory
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.replica import Lease, Replica
from modelpool.runtime.timing import RequestTiming
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")


class SlotState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


_ALL_STATES = [s.value for s in SlotState]


class CapacityGate(Protocol):
    async def make_room(self, slot: ModelSlot, need: Need) -> None:
        """Unload what must go so that `need` fits, or raise InsufficientCapacity."""


class _NoLimits:
    async def make_room(self, slot: ModelSlot, need: Need) -> None:
        return None


class ModelSlot:
    def __init__(
        self,
        config: ModelConfig,
        tasks: frozenset[Task],
        make_backend: Callable[[ModelConfig], Backend],
        metrics: Metrics,
        clock: Clock,
        capacity: CapacityGate | None = None,
        *,
        remote: bool = False,
    ) -> None:
        self.config = config
        self.remote = remote
        """Served by a remote upstream: requests must pass the `allow_remote` gate."""
        self.tasks = tasks
        self._make_backend = make_backend
        self._metrics = metrics
        self._clock = clock
        self.capacity: CapacityGate = capacity or _NoLimits()
        self.replicas: list[Replica] = []
        self.admission = Admission(turns=self._turns(), queue=self._queue_size(), model_id=config.id)
        self.state = SlotState.UNLOADED
        self.error: str | None = None
        self.failed_at: float | None = None
        self.load_seconds: float | None = None
        self.loaded_at: float | None = None
        self.last_used: float = clock.monotonic()
        self.expires_at: float | None = None
        self.estimate: MemoryEstimate | None = None
        """Per replica, from the backend before loading (or from `memory_bytes`)."""
        self.created = int(clock.time())
        self._load: asyncio.Task[None] | None = None
        self._unload: asyncio.Task[None] | None = None
        self._leases: set[Lease] = set()
        self._none_running = asyncio.Event()
        self._none_running.set()
        self._closing = False
        self._background: set[asyncio.Task[None]] = set()
        self.crashes = CrashRecord()
        self._cleanup: asyncio.Task[None] | None = None
        self.embedding_cache = EmbeddingCache(config.embedding_cache_size)
        """Rows are only valid for the weights and options they came from: cleared on unload."""
        self._set_state(SlotState.UNLOADED)

    @property
    def id(self) -> str:
        return self.config.id

    # ----- what the pool reads -------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Work is running or waiting, or the slot is changing state: not evictable."""
        changing = self.state in (SlotState.LOADING, SlotState.UNLOADING)
        return changing or self.admission.running > 0 or self.admission.waiting > 0

    def holds_memory(self) -> bool:
        return self.state in (SlotState.LOADING, SlotState.READY, SlotState.UNLOADING)

    def readiness_problem(self) -> ModelpoolError | None:
        """Why a request now would not be served without waiting for a load: None when the
        model is ready or would load on demand (unloaded, autoload on, not failed)."""
        if self.state is SlotState.FAILED:
            return ModelLoadFailed(f"model '{self.id}' failed to load: {self.error}",
                                   retry_after_s=self.config.retry_cooldown_s)  # fmt: skip
        if self.state is SlotState.LOADING:
            return ModelNotReady(f"model '{self.id}' is loading")
        if self.state is not SlotState.READY and not self.config.autoload:
            return ModelNotReady(f"model '{self.id}' is not loaded and has autoload off (`modelpool load {self.id}`)")
        return None

    def memory_bytes(self) -> int:
        """RAM: measured use when loaded, else the configured or estimated need."""
        count = len(self.replicas) or self.config.replicas
        if self.config.memory_bytes is not None:
            return int(self.config.memory_bytes) * count
        measured = sum(r.memory_bytes for r in self.replicas)
        if self.state is SlotState.READY and measured > 0:
            return measured
        return self._need_per_replica().memory_bytes * count

    def gpu_bytes(self) -> int:
        return self._need_per_replica().gpu_bytes * (len(self.replicas) or self.config.replicas)

    def as_resident(self) -> Resident:
        return Resident(
            self.id,
            self.memory_bytes(),
            self.last_used,
            busy=self.busy,
            pinned=self.config.pinned,
            gpu_bytes=self.gpu_bytes(),
        )

    def expired(self) -> bool:
        return (
            self.state is SlotState.READY
            and not self.busy
            and self.expires_at is not None
            and self._clock.monotonic() >= self.expires_at
        )

    # ----- requests ------------------------------------------------------------------

    async def lease(self, wait_s: float | None, keep_alive: float | None = None) -> Lease:
        """Admission (429 at once when full) → a loaded model → a turn on the least busy replica."""
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        ticket = self.admission.admit()
        asked = self._clock.monotonic()
        try:
            await self.ensure_ready(wait_s)
            loaded = self._clock.monotonic()
            await ticket.wait_turn()
            while self.state is not SlotState.READY or not self._routable():
                await self.ensure_ready(wait_s)  # unloaded while this request waited in line
        except BaseException:
            ticket.done()
            raise
        now = self._clock.monotonic()
        replica = min(self._routable(), key=lambda r: r.running)
        timing = RequestTiming(
            load_wait_s=loaded - asked, queue_wait_s=now - loaded, replica=replica.index, started=now
        )
        lease = Lease(self.id, replica, ticket, timing, keep_alive, self._on_release)
        self._leases.add(lease)
        self._none_running.clear()
        self._metrics.queue_seconds.labels(model=self.id).observe(timing.queue_wait_s)
        return lease

    async def ensure_ready(self, wait_s: float | None, *, load_if_unloaded: bool | None = None) -> None:
        """Return once the model is ready, starting a load if nobody has."""
        while self._unload is not None:
            await asyncio.shield(self._unload)
        if self.state is SlotState.READY:
            return
        if self._load is None:
            self._begin_load(self.config.autoload if load_if_unloaded is None else load_if_unloaded)
        assert self._load is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._load), timeout=wait_s)
        except TimeoutError:
            raise ModelNotReady(f"model '{self.id}' is still loading; retry shortly") from None

    def _begin_load(self, may_load: bool) -> None:
        delay = 0.0
        if self.state is SlotState.FAILED and self.crashes.in_a_row:
            since = self._clock.monotonic() - (self.failed_at or 0.0)
            delay = self.crashes.restart_delay(self.config, since, self.error)
        elif self.state is SlotState.FAILED:
            waited = self._clock.monotonic() - (self.failed_at or 0.0)
            if waited < self.config.retry_cooldown_s:
                raise ModelLoadFailed(
                    f"model '{self.id}' failed to load: {self.error} (next try in "
                    f"{self.config.retry_cooldown_s - waited:.0f}s)",
                    retry_after_s=self.config.retry_cooldown_s - waited,
                )
        elif not may_load:
            raise ModelNotLoaded(
                f"model '{self.id}' is not loaded and has autoload off; an admin must load it first "
                f"(`modelpool load {self.id}`)",
                param="model",
            )
        self._set_state(SlotState.LOADING)  # at once, so nobody sees "unloaded" meanwhile
        self._load = asyncio.create_task(self._load_replicas(delay), name=f"load-{self.id}")

    def forgive_crashes(self) -> None:
        """An explicit load: a crash-looped model may start again at once."""
        if self.crashes.in_a_row:
            self.crashes = CrashRecord()
            self.failed_at = None

    def _on_release(self, lease: Lease) -> None:
        self._leases.discard(lease)
        now = self._clock.monotonic()
        self.last_used = now
        keep_alive = self.config.keep_alive if lease.keep_alive is None else lease.keep_alive
        self.expires_at = None if keep_alive < 0 else now + keep_alive
        if not self._leases:
            self._none_running.set()
        if keep_alive == 0 and not self.busy and self.state is SlotState.READY:
            task = asyncio.get_running_loop().create_task(self.unload(), name=f"unload-{self.id}")
            self._background.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._background.discard)

    def _routable(self) -> list[Replica]:
        return [r for r in self.replicas if not r.retiring]

    # ----- loading -------------------------------------------------------------------

    async def _load_replicas(self, delay: float = 0.0) -> None:
        started = self._clock.monotonic()
        try:
            if self._cleanup is not None:
                await asyncio.gather(self._cleanup, return_exceptions=True)
            if delay > 0:
                log.info("restarting after a crash", extra={"model": self.id, "in_s": round(delay, 2)})
                await asyncio.sleep(delay)
            first = self._make_backend(self.config)
            self.estimate = await first.estimate_memory()
            per_replica = self._need_per_replica()
            replicas = self.config.replicas
            await self.capacity.make_room(
                self, Need(per_replica.memory_bytes * replicas, per_replica.gpu_bytes * replicas)
            )
            for index in range(self.config.replicas):
                backend = first if index == 0 else self._make_backend(self.config)
                self.replicas.append(await self._start_replica(index, backend))
        except BaseException as exc:
            await self._fail(exc)
            raise self._as_load_error(exc) from exc
        finally:
            self._load = None
        self.load_seconds = self._clock.monotonic() - started
        self.loaded_at = self._clock.time()
        self.last_used = self._clock.monotonic()
        self.expires_at = None if self.config.keep_alive < 0 else self.last_used + self.config.keep_alive
        self._metrics.load_seconds.labels(model=self.id).observe(self.load_seconds)
        self.admission.resize(self._turns(), self._queue_size())
        self._set_state(SlotState.READY)
        log.info(
            "model ready",
            extra={"model": self.id, "replicas": len(self.replicas), "load_seconds": round(self.load_seconds, 3)},
        )

    async def _start_replica(self, index: int, backend: Backend) -> Replica:
        before = process_rss()
        try:
            await backend.start()
            if self.config.warmup:
                await backend.warmup()
        except BaseException:
            await _stop_quietly(backend)
            raise
        replica = Replica(index, backend, max(0, process_rss() - before), started_at=self._clock.monotonic())
        if self.remote:
            replica.memory_bytes = 0  # whatever grew meanwhile was not this model
        elif isinstance(backend, ProcessBackend):
            replica.memory_bytes = backend.resident_bytes()
            backend.supervise(lambda message: self._crashed(replica, message))
        if Task.EMBEDDING in self.tasks and isinstance(backend, EmbeddingBackend):
            embed_tokens = getattr(backend, "embed_tokens")  # noqa: B009 - EmbeddingBackend
            replica.batcher = EmbeddingBatcher(embed_tokens, self.config.batch, f"{self.id}#{index}")
        return replica

    def _crashed(self, replica: Replica, message: str) -> None:
        """A replica's engine process died unasked: the model is failed until a request restarts it."""
        if replica not in self.replicas or self.state is not SlotState.READY:
            return  # it is being stopped anyway
        now = self._clock.monotonic()
        output = replica.backend.log_tail(200) if isinstance(replica.backend, ProcessBackend) else []
        self.crashes.crashed(now - replica.started_at, output)
        self.error, self.failed_at = message, now
        self._set_state(SlotState.FAILED)
        in_a_row = self.crashes.in_a_row
        log.error("engine process crashed", extra={"model": self.id, "in_a_row": in_a_row, "error": message})
        self._cleanup = asyncio.get_running_loop().create_task(self._stop_replicas(), name=f"cleanup-{self.id}")

    def logs(self, count: int) -> list[dict[str, object]]:
        """The last output lines of each replica's engine process."""
        return [
            {"replica": r.index, "pid": r.backend.pid, "lines": r.backend.log_tail(count)}
            for r in self.replicas
            if isinstance(r.backend, ProcessBackend)
        ]

    def _need_per_replica(self) -> Need:
        estimate = self.estimate or MemoryEstimate(0)
        ram = estimate.ram_bytes if self.config.memory_bytes is None else int(self.config.memory_bytes)
        return Need(ram, estimate.gpu_bytes)

    async def _fail(self, exc: BaseException) -> None:
        self.error = str(exc) or type(exc).__name__
        self.failed_at = self._clock.monotonic()
        await self._stop_replicas()
        self._set_state(SlotState.FAILED)
        log.error("model failed to load", extra={"model": self.id, "error": self.error})

    def _as_load_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, ModelpoolError):
            return exc
        if isinstance(exc, Exception):
            return ModelLoadFailed(
                f"model '{self.id}' failed to load: {self.error}", retry_after_s=self.config.retry_cooldown_s
            )
        return exc  # cancellation and friends pass through untouched

    # ----- unloading and scaling -----------------------------------------------------

    async def unload(self, *, drain: bool = True) -> None:
        """Stop every replica. drain: wait for running requests; else cut them off (503)."""
        if self._load is not None:
            await asyncio.gather(self._load, return_exceptions=True)
        if self._unload is not None:
            await asyncio.shield(self._unload)
            return
        if self.state is SlotState.FAILED:
            self.error, self.failed_at = None, None
            self._set_state(SlotState.UNLOADED)
        if self.state is not SlotState.READY:
            return
        self._set_state(SlotState.UNLOADING)
        self._unload = asyncio.create_task(self._drain_and_stop(drain), name=f"unload-{self.id}")
        try:
            await asyncio.shield(self._unload)
        finally:
            self._unload = None

    async def _drain_and_stop(self, drain: bool) -> None:
        if not drain:
            for lease in list(self._leases):
                lease.revoked = True
        await self._none_running.wait()
        await self._stop_replicas()
        self.expires_at = None
        self._set_state(SlotState.UNLOADED)
        log.info("model unloaded", extra={"model": self.id})

    async def _stop_replicas(self) -> None:
        self.embedding_cache.clear()
        replicas, self.replicas = self.replicas, []
        for replica in replicas:
            if replica.batcher is not None:
                await replica.batcher.close()
            await _stop_quietly(replica.backend, detach=self._closing)
        if replicas:
            release_freed_memory()

    async def scale(self, replicas: int) -> None:
        """Change the number of replicas of a loaded model (replica_max caps it)."""
        self.config = self.config.model_copy(update={"replicas": replicas})
        if self.state is not SlotState.READY:
            return
        active = self._routable()
        if replicas > len(active):
            extra = replicas - len(active)
            need = self._need_per_replica()
            await self.capacity.make_room(
                self, Need(need.memory_bytes * extra, need.gpu_bytes * extra, new_model=False)
            )
            start = max((r.index for r in self.replicas), default=-1) + 1
            for index in range(start, start + extra):
                self.replicas.append(await self._start_replica(index, self._make_backend(self.config)))
        else:
            await self._retire(active[replicas:])
        self.admission.resize(self._turns(), self._queue_size())

    async def _retire(self, leaving: list[Replica]) -> None:
        for replica in leaving:
            replica.retiring = True
        await asyncio.gather(*(replica.idle.wait() for replica in leaving))
        for replica in leaving:
            self.replicas.remove(replica)
            if replica.batcher is not None:
                await replica.batcher.close()
            await _stop_quietly(replica.backend)
        release_freed_memory()

    async def reconfigure(self, config: ModelConfig) -> None:
        """Take new settings; a loaded model is unloaded (drained) first and loads with them next."""
        await self.unload()
        self.config = config
        self.admission.resize(self._turns(), self._queue_size())

    def close(self) -> None:
        self._closing = True

    # ----- helpers -------------------------------------------------------------------

    def _turns(self) -> int:
        engine_limit = self.replicas[0].backend.limits.max_concurrency if self.replicas else None
        per_replica = self.config.max_concurrency or engine_limit or 1
        if engine_limit is not None:  # an engine that runs one request at a time gets one turn, whatever the config
            per_replica = min(per_replica, engine_limit)
        if Task.EMBEDDING in self.tasks:  # batched: many requests share one engine call
            per_replica = max(per_replica, self.config.batch.max_batch_size)
        return per_replica * max(1, len(self._routable()) if self.replicas else self.config.replicas)

    def _queue_size(self) -> int:
        return self.config.max_queue * max(1, self.config.replicas)

    def _set_state(self, state: SlotState) -> None:
        self.state = state
        self._metrics.set_model_state(self.id, state.value, _ALL_STATES)


async def _stop_quietly(backend: Backend, *, detach: bool = False) -> None:
    """Stop a backend, logging (not raising) what goes wrong. detach: modelpool is shutting
    down, and a persistent engine process is left running to be adopted next time."""
    try:
        if detach and isinstance(backend, ProcessBackend):
            await backend.detach()
        else:
            await backend.stop()
    except Exception:
        log.exception("stopping a backend failed")
