"""A model slot: one configured model, its replicas and its load state.

The slot owns its lifecycle: it asks `lifecycle.decide` what an event means and applies the
answer (start a load, wait, refuse, drain, clean up). Callers never read `state` and act on
it. Concurrent first requests share one load. Making room for a load (which may unload
other models) is asked of the pool through `CapacityGate`; replicas are started and
stopped by `ReplicaSet`; crash bookkeeping is `CrashRecord`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from modelpool import tracing
from modelpool.backends.base import (
    Backend,
    EmbeddingBackend,
    MemoryEstimate,
    SpeechBackend,
    contract_problem,
    implements,
)
from modelpool.backends.runtime_modules import runtime_modules
from modelpool.capabilities import ModelCapabilities
from modelpool.config.reload_diff import with_hot_fields
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.errors import (
    LoadAbandoned,
    ModelLoadFailed,
    ModelNotFound,
    ModelNotReady,
    ModelpoolError,
    ShuttingDown,
)
from modelpool.inference import EmbeddingRequest, Voice
from modelpool.owner import DEFAULT_SCHEDULE, Priority, Schedule
from modelpool.pool_api.timing import RequestTiming
from modelpool.runtime.admission import Admission
from modelpool.runtime.clock import Clock
from modelpool.runtime.crashes import CrashRecord
from modelpool.runtime.detached import detached_task
from modelpool.runtime.download import Download, fetch, plan_download
from modelpool.runtime.eviction import Need, Resident
from modelpool.runtime.lease import Lease
from modelpool.runtime.lifecycle import Action, Decision, Event, Facts, Policy, SlotState, decide
from modelpool.runtime.memory import settle_heap
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.replicas import Replica, ReplicaSet
from modelpool.runtime.slot_status import load_error_of, readiness_problem_of, refusal_of, status_of
from modelpool.runtime.slot_work import CapacityGate, LoadRecord, NoLimits, SlotTasks
from modelpool.runtime.tasks.embedding_cache import EmbeddingCache
from modelpool.status import EngineLogs, ModelStatus
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")
B = TypeVar("B", bound=Backend)
FORCED_UNLOAD_GRACE_S = 0.25
"""How long an unload with `drain: false` waits for the requests it revoked to stop."""
_ALL_STATES = [s.value for s in SlotState]


class ModelSlot:
    def __init__(
        self,
        config: ModelConfig,
        capabilities: ModelCapabilities,
        make_backend: Callable[[ModelConfig], Backend],
        metrics: Metrics,
        clock: Clock,
        capacity: CapacityGate | None = None,
        hub: HubLocation | None = None,
        accounts: MemoryAccounts | None = None,
    ) -> None:
        self.config = config
        self.capabilities = capabilities
        self.created = int(clock.time())
        self.state = SlotState.UNLOADED
        self.record = LoadRecord()
        self.crashes = CrashRecord()
        self.last_used = clock.monotonic()
        self.expires_at: float | None = None
        self._accounts = accounts or MemoryAccounts()
        self.replicas = ReplicaSet(config.id, clock, self._crashed, self._accounts)
        self.admission = Admission(
            turns=self._turns(), queue=self._queue_size(), model_id=config.id, per_key=self._per_key_size(),
            aging_s=config.priority_aging_s, clock=clock.monotonic,
        )  # fmt: skip
        for priority in Priority:  # read at scrape time: the queue is the one source of its depth
            metrics.queued.labels(model=config.id, priority=priority.value).set_function(
                functools.partial(self.admission.waiting_in, priority)
            )
        counted = metrics.cache_lookup_counter(config.id) if config.embedding_cache_size else None
        self.embedding_cache = EmbeddingCache(config.embedding_cache_size, counted)
        """Rows are only valid for the weights and options they came from: cleared on unload."""
        self.dimensions: int | None = None
        """An embedding model's vector size, as its vectors show it: probed as it loads (with
        its warmup), and seen on every embedding; None until then (`/v1/models` shows it)."""
        self._make_backend = make_backend
        self._metrics = metrics
        self._clock = clock
        self._capacity = capacity or NoLimits()
        self._work = SlotTasks()
        self._room_granted = False
        """The load in flight has its room (see `eviction.Resident.granted`)."""
        self._hub = hub
        """Where `hf:` weights come from; None: no download phase (sources are local)."""
        self.download: Download | None = None
        """The weights download in flight, the first phase of a load (see `runtime.download`)."""
        self._downloading = asyncio.Event()
        self._download_cancel: threading.Event | None = None
        """Set to stop the download phase of the load in flight (from its listing call on)."""
        self._set_state(SlotState.UNLOADED)

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def tasks(self) -> frozenset[Task]:
        return self.capabilities.tasks

    @property
    def clock(self) -> Clock:
        return self._clock

    # ----- what the pool reads -------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Work is running or waiting, or the slot is changing state: not evictable."""
        changing = self.state in (SlotState.LOADING, SlotState.UNLOADING)
        return changing or self.admission.running > 0 or self.admission.waiting > 0

    @property
    def closing(self) -> bool:
        """The server is shutting down: a load still waiting for room gives up."""
        return self._work.closing

    def holds_memory(self) -> bool:
        return self.state in (SlotState.LOADING, SlotState.READY, SlotState.UNLOADING)

    def readiness_problem(self) -> ModelpoolError | None:
        """Why a request now would not be served without waiting for a load: None when the
        model is ready or would load on demand (unloaded, autoload on, not failed)."""
        return readiness_problem_of(self)

    def memory_bytes(self) -> int:
        """RAM: measured use when loaded (and what it may still grow by under load), else
        the configured or estimated need (an estimate includes that growth)."""
        count = len(self.replicas) or self.config.replicas
        if self.config.memory_bytes is not None:
            return int(self.config.memory_bytes) * count
        measured = self.replicas.measured_bytes()
        if self.state is SlotState.READY and measured > 0:
            return measured + self.replicas.growth().ram_bytes
        return self._need_per_replica().memory_bytes * count

    def gpu_bytes(self) -> int:
        """GPU memory: measured use when loaded (and measurable; with what it may still grow
        by under load), else the estimated need."""
        measured = self.replicas.measured_gpu_bytes()
        if self.state is SlotState.READY and measured > 0:
            return measured + self.replicas.growth().gpu_bytes
        return self._need_per_replica().gpu_bytes * (len(self.replicas) or self.config.replicas)

    def as_resident(self) -> Resident:
        return Resident(
            self.id,
            self.memory_bytes(),
            self.last_used,
            busy=self.busy,
            pinned=self.config.pinned,
            gpu_bytes=self.gpu_bytes(),
            changing=self.state in (SlotState.LOADING, SlotState.UNLOADING),
            granted=self.state is not SlotState.LOADING or self._room_granted,
        )

    def expired(self) -> bool:
        return decide(self._facts(), Event.TICK).action is Action.UNLOAD

    def status(self) -> ModelStatus:
        return status_of(self)

    async def voices(self) -> list[Voice]:
        """The model's voices, from its files, by a backend that is never started."""
        backend = self._new_backend()
        return await backend.voices() if implements(backend, SpeechBackend) else []

    def engine_logs(self, count: int) -> EngineLogs:
        """The last output of each engine process, and of the one that crashed last."""
        last = self.crashes.last_output
        return EngineLogs(self.id, self.state.value, self.replicas.output(count),
                          self.record.error if last else None, last[-count:])  # fmt: skip

    # ----- requests ------------------------------------------------------------------

    async def lease(
        self,
        protocol: type[B],
        wait_s: float | None,
        keep_alive: float | None = None,
        *,
        size: int = 1,
        schedule: Schedule = DEFAULT_SCHEDULE,
    ) -> Lease[B]:
        """Admission (429 at once when full) → a loaded model → a turn on the least busy
        replica, whose backend serves `protocol` (the task's Protocol, checked at load).
        `size`: sequences the request runs at once (a batch), counted by admission as such;
        `schedule`: the caller's class and fair-share party in the queue."""
        if self._work.closing:
            raise ShuttingDown("the server is shutting down")
        self._refuse_if_retired()
        with tracing.span("modelpool.queue", {tracing.MODEL: self.id}) as queued:
            # A batch runs on one replica: it takes at most that replica's turns.
            ticket = self.admission.admit(size=min(size, self._turns_per_replica()), schedule=schedule)
            asked = self._clock.monotonic()
            try:
                await self.ensure_ready(wait_s)
                loaded = self._clock.monotonic()
                await ticket.wait_turn()
                self._refuse_if_retired()  # removed by a reload while this request waited in line
                while self.state is not SlotState.READY or not self.replicas.routable():
                    await self.ensure_ready(wait_s)  # unloaded while this request waited in line
                replica = self.replicas.least_busy()
                backend = replica.backend
                if not implements(backend, protocol):  # checked at load: only a broken backend gets here
                    raise ModelLoadFailed(f"model '{self.id}': its backend does not implement {protocol.__name__}")
            except BaseException:
                ticket.done()
                raise
            now = self._clock.monotonic()
            queued.set_attribute("modelpool.load_wait_s", loaded - asked)
            queued.set_attribute(tracing.REPLICA, replica.index)
        timing = RequestTiming(
            load_wait_s=loaded - asked, queue_wait_s=now - loaded, replica=replica.index, started=now
        )
        self._metrics.observe_queue_wait(self.id, timing.queue_wait_s)
        return Lease(self.id, replica, backend, ticket, timing, keep_alive, self._on_release)

    async def ensure_ready(self, wait_s: float | None, *, explicit: bool = False) -> None:
        """Return once the model is ready, starting a load if nobody has. explicit: an admin
        load or preload, which loads even with autoload off."""
        while self._work.unload is not None:
            await asyncio.shield(self._work.unload)
        self._refuse_if_retired()  # never loads again: nothing would unload it
        decision = decide(self._facts(), Event.LOAD if explicit else Event.REQUEST)
        if decision.action is Action.SERVE:
            return
        if decision.action is Action.REFUSE:
            raise self._refusal(decision)
        if explicit:
            self._work.asked_explicitly = True  # the load goes on even if its requests leave
        if decision.action is Action.LOAD:
            self._set_state(SlotState.LOADING)  # at once, so nobody sees "unloaded" meanwhile
            self._work.load = detached_task(self._load(decision.delay_s), name=f"load-{self.id}")  # not this request's
        load = self._work.load
        assert load is not None, "a slot in LOADING always has its load task"
        if explicit:
            try:
                await asyncio.wait_for(asyncio.shield(load), timeout=wait_s)
            except asyncio.TimeoutError:  # not the builtin on Python 3.10
                if self.download is not None:  # say how far, as a request is told
                    raise self.download.not_ready(self.id) from None
                raise ModelNotReady(f"model '{self.id}' is still loading; retry shortly") from None
            return
        await self._await_load(load, wait_s)

    async def _await_load(self, load: asyncio.Task[None], wait_s: float | None) -> None:
        """A request waits for the load, but not for a download: that is a 503 with its progress."""
        downloading = asyncio.ensure_future(self._downloading.wait())
        try:
            done, _ = await asyncio.wait({load, downloading}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            downloading.cancel()
        if load in done:
            return load.result()
        if self.download is not None:
            raise self.download.not_ready(self.id)
        raise ModelNotReady(f"model '{self.id}' is still loading; retry shortly")

    def wanted(self) -> bool:
        """Whether a load under way is still wanted: asked for explicitly, or a request waits."""
        return self._work.asked_explicitly or self.admission.running > 0 or self.admission.waiting > 0

    def forgive_crashes(self) -> None:
        """An explicit load: a crash-looped model may start again at once."""
        if self.crashes.in_a_row:
            self.crashes = CrashRecord()
            self.record.failed_at = None

    def _on_release(self, lease: Lease[Backend]) -> None:
        now = self._clock.monotonic()
        self.last_used = now
        keep_alive = self.config.keep_alive if lease.keep_alive is None else lease.keep_alive
        self.expires_at = None if keep_alive < 0 else now + keep_alive
        if keep_alive == 0 and not self.busy and self.state is SlotState.READY:
            self._work.spawn(self.unload(), name=f"unload-{self.id}")

    # ----- loading -------------------------------------------------------------------

    async def _load(self, delay: float = 0.0) -> None:
        started = self._clock.monotonic()
        try:
            await self._work.finish_cleanup()
            if delay > 0:
                log.info("restarting after a crash", extra={"model": self.id, "in_s": round(delay, 2)})
                await asyncio.sleep(delay)
            await self._start_replicas()
        except LoadAbandoned:
            await self._stop_replicas()
            self._apply(Event.LOAD_ABANDONED)
            log.info("load abandoned: no request waits for the model", extra={"model": self.id})
            raise
        except BaseException as exc:
            await self._fail(exc)
            raise self._as_load_error(exc) from exc
        finally:
            self._work.load = None
            self._work.asked_explicitly = False
        self.record.load_seconds = self._clock.monotonic() - started
        self.record.loaded_at = self._clock.time()
        self.last_used = self._clock.monotonic()
        self.expires_at = None if self.config.keep_alive < 0 else self.last_used + self.config.keep_alive
        self._metrics.load_seconds.labels(model=self.id).observe(self.record.load_seconds)
        self._resize_admission()
        self._apply(Event.LOADED)
        settle_heap()  # the model's objects live as long as it is loaded
        seconds = round(self.record.load_seconds, 3)
        log.info("model ready", extra={"model": self.id, "replicas": len(self.replicas), "load_seconds": seconds})

    async def _start_replicas(self) -> None:
        self._room_granted = False
        await self._download_weights()
        # The runtime first, measured alone as its own (and known to the budget before the
        # room for this model is judged); estimating may import it otherwise (torch's device).
        await self.import_runtimes()
        first = self._new_backend()
        self.record.estimate = await first.estimate_memory()
        await self._make_room(self.config.replicas, new_model=True)
        self._room_granted = True
        for index in range(self.config.replicas):
            backend = first if index == 0 else self._new_backend()
            await self.replicas.start(index, backend, self.config, self.capabilities, self.record.estimate)
        if self._probes_dimensions() and implements(first, EmbeddingBackend):
            probe = await first.embed(EmbeddingRequest(("dimensions",)))  # one more tiny warmup request
            self.dimensions = int(probe.vectors.shape[1])

    def _probes_dimensions(self) -> bool:
        """An embedding model learns its vector size as it loads, with its warmup; a remote
        upstream is not called before a request that allows it asks."""
        local = not self.capabilities.remote
        return local and self.config.warmup and Task.EMBEDDING in self.tasks

    async def import_runtimes(self) -> None:
        """Import the runtimes this model's backend needs, each measured once for the process."""
        await self._accounts.import_runtimes(runtime_modules(self.config.backend))

    async def _download_weights(self) -> None:
        """Fetch `hf:` weights not cached yet, before the capacity check (see `runtime.download`)."""
        if self._hub is None:
            return
        self._download_cancel = threading.Event()
        try:
            download = await plan_download(self.config, self._hub, self._capacity.weights_room(), self._download_cancel)
            if download is None:
                return
            self.download = download
            self._downloading.set()
            log.info("downloading weights", extra={"model": self.id, "bytes": download.total_bytes})
            await fetch(download)
        finally:
            self.download, self._download_cancel = None, None
            self._downloading.clear()

    def _new_backend(self) -> Backend:
        """A backend for the next replica, checked against what the model is asked to serve."""
        backend = self._make_backend(self.config)
        declared = self.capabilities.declared
        problem = contract_problem(backend, self.capabilities.tasks, declared.locality, tokenizer=declared.tokenizer)
        if problem is not None:
            raise ModelLoadFailed(
                f"model '{self.id}': backend '{self.config.backend}' does not keep its contract: {problem}",
                retry_after_s=self.config.retry_cooldown_s,
            )
        return backend

    async def _make_room(self, replicas: int, *, new_model: bool) -> None:
        need = self._need_per_replica()
        await self._capacity.make_room(
            self, Need(need.memory_bytes * replicas, need.gpu_bytes * replicas, new_model=new_model)
        )

    def _crashed(self, replica: Replica, message: str) -> None:
        """A replica's engine process died unasked: the model is failed until a request restarts it."""
        if replica not in self.replicas.members or self.state is not SlotState.READY:
            return  # it is being stopped anyway
        now = self._clock.monotonic()
        self.crashes.crashed(now - replica.started_at, replica.output(200))
        self.record.error, self.record.failed_at = message, now
        self._apply(Event.CRASHED)
        log.error("engine process crashed", extra={"model": self.id, "in_a_row": self.crashes.in_a_row,
                                                   "error": message})  # fmt: skip
        self._work.cleanup = asyncio.get_running_loop().create_task(self.replicas.stop_all(), name=f"cleanup-{self.id}")

    def _need_per_replica(self) -> Need:
        estimate = self.record.estimate or MemoryEstimate(0)
        ram = estimate.ram_bytes if self.config.memory_bytes is None else int(self.config.memory_bytes)
        return Need(ram, estimate.gpu_bytes)

    async def _fail(self, exc: BaseException) -> None:
        self.record.error = str(exc) or type(exc).__name__
        self.record.failed_at = self._clock.monotonic()
        await self._stop_replicas()
        self._apply(Event.LOAD_FAILED)
        log.error("model failed to load", extra={"model": self.id, "error": self.record.error})

    def _as_load_error(self, exc: BaseException) -> BaseException:
        return load_error_of(self, exc)

    def _refusal(self, decision: Decision) -> ModelpoolError:
        return refusal_of(self, decision)

    # ----- unloading and scaling -----------------------------------------------------

    async def unload(self, *, drain: bool = True) -> None:
        """Stop every replica. drain: wait for running requests; else cut them off (503).
        A download in flight is cancelled (its load then fails, and the failure is forgotten)."""
        if self._download_cancel is not None:
            self._download_cancel.set()
        if self._work.load is not None:
            await asyncio.gather(self._work.load, return_exceptions=True)
        if self._work.unload is not None:
            await asyncio.shield(self._work.unload)
            return
        decision = self._apply(Event.UNLOAD)
        if decision.action is Action.FORGET:
            self.record.error, self.record.failed_at = None, None
        if decision.action is not Action.DRAIN:
            return
        self._work.unload = asyncio.create_task(self._drain_and_stop(drain), name=f"unload-{self.id}")
        try:
            await asyncio.shield(self._work.unload)
        finally:
            self._work.unload = None

    async def _drain_and_stop(self, drain: bool) -> None:
        if drain:
            await self.replicas.wait_idle()
        else:
            self.replicas.revoke_all()
            # Streams being read stop at their next item; one whose client stopped reading
            # notices only when its send returns (cut after the send timeout): not waited for.
            with contextlib.suppress(asyncio.TimeoutError):  # not the builtin TimeoutError on 3.10
                await asyncio.wait_for(self.replicas.wait_idle(), FORCED_UNLOAD_GRACE_S)
        await self._stop_replicas()
        self.expires_at = None
        self._apply(Event.STOPPED)
        log.info("model unloaded", extra={"model": self.id})

    async def _stop_replicas(self) -> None:
        self.embedding_cache.clear()
        await self.replicas.stop_all(detach=self._work.closing)

    async def scale(self, replicas: int) -> None:
        """Change the number of replicas of a loaded model (replica_max caps it)."""
        self.config = self.config.model_copy(update={"replicas": replicas})
        if self.state is not SlotState.READY:
            return
        active = self.replicas.routable()
        if replicas > len(active):
            extra = replicas - len(active)
            await self._make_room(extra, new_model=False)
            start = self.replicas.next_index()
            for index in range(start, start + extra):
                await self.replicas.start(
                    index, self._new_backend(), self.config, self.capabilities, self.record.estimate
                )
        else:
            await self.replicas.retire(active[replicas:])
        self._resize_admission()

    async def reconfigure(self, config: ModelConfig, capabilities: ModelCapabilities) -> None:
        """Take new settings; a loaded model is unloaded (drained) first and loads with them next."""
        await self.unload()
        self.config, self.capabilities = config, capabilities
        self._resize_admission()

    def retune(self, config: ModelConfig, capabilities: ModelCapabilities | None = None) -> None:
        """Take `config`'s settings that apply without a reload (a config reload's hot
        changes: `HOT_MODEL_FIELDS`), and the capabilities they make; every other setting
        stays what the loaded engine was made with (its options and replicas, which an
        admin may have overridden, too)."""
        self.config = with_hot_fields(self.config, config)
        if capabilities is not None:
            self.capabilities = capabilities
        self._resize_admission()

    def retire(self) -> None:
        """Removed by a config reload: requests not yet on a replica (in line, or asking
        now) get the 404 of an unknown model; it never loads again, and its /metrics series
        go (a model of the same id added later publishes its own)."""
        self._work.retired = True
        self._metrics.forget_model(self.id, _ALL_STATES, [priority.value for priority in Priority])

    def _refuse_if_retired(self) -> None:
        if self._work.retired:
            raise ModelNotFound(self.id, None)

    def close(self) -> None:
        self._work.closing = True
        if self._download_cancel is not None:
            self._download_cancel.set()  # a download thread must not hold the server's shutdown

    # ----- helpers -------------------------------------------------------------------

    def _facts(self) -> Facts:
        config = self.config
        policy = Policy(config.autoload, config.retry_cooldown_s, config.restart_backoff_s, config.max_restarts)
        return Facts(self.state, self._clock.monotonic(), policy, self.record.failed_at, self.crashes.in_a_row,
                     self.busy, self.expires_at)  # fmt: skip

    def _apply(self, event: Event) -> Decision:
        decision = decide(self._facts(), event)
        if decision.state is not self.state:
            self._set_state(decision.state)
        return decision

    def _turns(self) -> int:
        replicas = len(self.replicas.routable()) if len(self.replicas) else self.config.replicas
        return self._turns_per_replica() * max(1, replicas)

    def _turns_per_replica(self) -> int:
        engine = self.capabilities.declared.engine_concurrency
        per_replica = min(self.config.max_concurrency or engine, engine)  # an engine's limit wins over the config
        if self.tasks & {Task.EMBEDDING, Task.RERANK}:  # batched: many requests share one engine call
            per_replica = max(per_replica, self.config.batch.max_batch_size)
        return per_replica

    def _resize_admission(self) -> None:
        """The queue's limits and aging from the config now (every setting, so none falls back
        to a default when another changes)."""
        self.admission.resize(self._turns(), self._queue_size(), self._per_key_size(), self.config.priority_aging_s)

    def _queue_size(self) -> int:
        return self.config.max_queue * max(1, self.config.replicas)

    def _per_key_size(self) -> int | None:
        per_key = self.config.max_queue_per_key
        return None if per_key is None else per_key * max(1, self.config.replicas)

    def _set_state(self, state: SlotState) -> None:
        self.state = state
        if not self._work.retired:  # its series are gone; a new model of the same id may own them
            self._metrics.set_model_state(self.id, state.value, _ALL_STATES)
