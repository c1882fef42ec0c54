"""The pool as a library: the served models, found by id or alias, the one way in for
every request (task check → lease → run), room-making for loads, and idle reaping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from modelpool.backends.base import (
    Backend,
    ChatBackend,
    ChatRequest,
    CompletionBackend,
    CompletionRequest,
    EmbeddingBackend,
    EmbeddingRequest,
    EmbeddingResult,
    ForwardedEmbeddingBackend,
    GenerationChunk,
    ScoringBackend,
    Segment,
    SpeechBackend,
    SpeechRequest,
    TranscriptionBackend,
    TranscriptionRequest,
)
from modelpool.backends.registry import backend_class, build_backend, model_tasks, parse_options
from modelpool.config.schema import Config, ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.errors import (
    ConfigError,
    InvalidRequest,
    ModelLoadFailed,
    ModelNotFound,
    ModelNotReady,
    ModelpoolError,
    RemoteNotAllowed,
    ShuttingDown,
    UnsupportedTask,
)
from modelpool.runtime.call import CallOptions
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.clock import Clock, SystemClock
from modelpool.runtime.embedding_cache import EmbeddingCache
from modelpool.runtime.eviction import Budget
from modelpool.runtime.generation import Generation, GenerationStream, collect
from modelpool.runtime.leased import LeasedStream
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.reasoning import split_reasoning
from modelpool.runtime.replica import Lease
from modelpool.runtime.scoring import Loglikelihood, loglikelihood
from modelpool.runtime.slot import ModelSlot, SlotState
from modelpool.runtime.timing import RequestTiming
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")
T = TypeVar("T")
DEFAULT_CALL = CallOptions()


class ModelPool:
    def __init__(
        self,
        slots: list[ModelSlot],
        metrics: Metrics,
        *,
        model_wait_s: float | None,
        budget: Budget | None = None,
        clock: Clock | None = None,
        reap_interval_s: float = 1.0,
    ) -> None:
        self.metrics = metrics
        self.model_wait_s = model_wait_s
        self.budget = budget or Budget()
        self.clock = clock or SystemClock()
        self.reap_interval_s = reap_interval_s
        self._slots = {slot.id: slot for slot in slots}
        self._names = {name: slot for slot in slots for name in [slot.id, *slot.config.aliases]}
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False
        self.capacity = Capacity(self.budget, self.slots)
        for slot in slots:
            slot.capacity = self.capacity

    # ----- lookup --------------------------------------------------------------------

    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def slot(self, name: str) -> ModelSlot:
        try:
            return self._names[name]
        except KeyError:
            raise ModelNotFound(name, list(self._slots)) from None

    def slot_for(self, name: str, task: Task, options: CallOptions = DEFAULT_CALL) -> ModelSlot:
        """The slot that serves `name` for `task`, once the request may use it."""
        slot = self.slot(name)
        if task not in slot.tasks:
            can = ", ".join(sorted(t.value for t in slot.tasks))
            raise UnsupportedTask(f"model '{slot.id}' does not do {task.value} (it does: {can})", param="model")
        if slot.remote and not (options.allow_remote or slot.config.allow_remote):
            raise RemoteNotAllowed(
                f"model '{slot.id}' is served by a remote upstream; send `allow_remote: true` with the request "
                "(or set `allow_remote: true` on the model) to use it",
                param="allow_remote",
            )
        return slot

    def metrics_label(self, name: str) -> str:
        """The model label for metrics: the canonical id, or "unknown" so that clients cannot
        grow the label set without bound by inventing model names."""
        slot = self._names.get(name)
        return slot.id if slot is not None else "unknown"

    # ----- lifetime ------------------------------------------------------------------

    def start(self) -> None:
        """Preload and start reaping idle models (call from inside the event loop)."""
        self._tasks = [
            asyncio.create_task(self.preload(), name="preload"),
            asyncio.create_task(self._reap_forever(), name="reaper"),
        ]

    async def preload(self) -> None:
        """Load every `preload: true` model; failures are kept on their slots, not raised."""
        wanted = [slot for slot in self._slots.values() if slot.config.preload]
        await asyncio.gather(
            *(slot.ensure_ready(None, load_if_unloaded=True) for slot in wanted), return_exceptions=True
        )

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, model → state) where ready means every preloaded model is ready."""
        states = {slot.id: slot.state.value for slot in self._slots.values()}
        ready = not self._closing and all(
            slot.state is SlotState.READY for slot in self._slots.values() if slot.config.preload
        )
        return ready, states

    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None:
        """Why the pool — or, given a name, that one model — is not ready, as the error a
        request would get (load error before not-ready); None when ready. Unknown name:
        ModelNotFound is raised."""
        if self._closing:
            return ShuttingDown("the server is shutting down")
        if name is not None:
            return self.slot(name).readiness_problem()
        waiting = [slot for slot in self._slots.values() if slot.config.preload and slot.state is not SlotState.READY]
        failed = [slot for slot in waiting if slot.state is SlotState.FAILED]
        if failed:
            reasons = "; ".join(f"model '{slot.id}' failed to load: {slot.error}" for slot in failed)
            return ModelLoadFailed(reasons, retry_after_s=max(slot.config.retry_cooldown_s for slot in failed))
        if waiting:
            states = ", ".join(f"'{slot.id}' ({slot.state.value})" for slot in waiting)
            return ModelNotReady(f"waiting for preloaded models: {states}")
        return None

    async def close(self) -> None:
        """Refuse new work, let running work finish, unload everything."""
        self._closing = True
        for slot in self._slots.values():
            slot.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(slot.unload() for slot in self._slots.values()), return_exceptions=True)

    async def reap_idle(self) -> list[str]:
        """Unload every model idle past its keep_alive; returns their ids."""
        expired = [slot for slot in self._slots.values() if slot.expired()]
        for slot in expired:
            log.info("unloading idle model", extra={"model": slot.id})
            await slot.unload()
        return [slot.id for slot in expired]

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval_s)
            try:
                await self.reap_idle()
            except Exception:
                log.exception("idle reaping failed")

    # ----- requests ------------------------------------------------------------------

    async def chat(self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL) -> GenerationStream:
        slot = self.slot_for(name, Task.CHAT, options)
        lease = await slot.lease(self.model_wait_s, options.keep_alive)
        parser = slot.config.reasoning_parser

        def run(backend: Backend) -> AsyncIterator[GenerationChunk]:
            chunks = cast(ChatBackend, backend).chat(request)
            return split_reasoning(chunks, parser) if parser else chunks

        return await self._start(lease, run, owns_lease=True)

    async def complete(
        self, name: str, request: CompletionRequest, options: CallOptions = DEFAULT_CALL
    ) -> GenerationStream:
        lease = await self.lease(name, Task.COMPLETION, options)
        return await self._start(lease, lambda b: cast(CompletionBackend, b).complete(request), owns_lease=True)

    async def complete_on(self, lease: Lease, request: CompletionRequest) -> GenerationStream:
        """One more completion on a lease the caller holds (and releases): the prompts of one
        request are admitted once, not each again behind other requests."""
        return await self._start(lease, lambda b: cast(CompletionBackend, b).complete(request), owns_lease=False)

    async def lease(self, name: str, task: Task, options: CallOptions = DEFAULT_CALL) -> Lease:
        """A turn on a ready replica of the model that `name` names (for callers that run
        several things on one turn). Release it."""
        return await self.slot_for(name, task, options).lease(self.model_wait_s, options.keep_alive)

    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[EmbeddingResult, RequestTiming]:
        slot = self.slot_for(name, Task.EMBEDDING, options)
        lease = await slot.lease(self.model_wait_s, options.keep_alive)
        try:
            result = await self._embed_on(lease, slot.embedding_cache, request)
        finally:
            lease.timing.backend_s = self.clock.monotonic() - lease.timing.started
            lease.release()
        lease.timing.prompt_tokens = result.prompt_tokens
        self.metrics.observe_timing(slot.id, lease.timing)
        return result, lease.timing

    async def _embed_on(self, lease: Lease, cache: EmbeddingCache, request: EmbeddingRequest) -> EmbeddingResult:
        backend = lease.backend
        if not isinstance(backend, EmbeddingBackend):  # computed upstream: no local tokens to batch or cache
            return await cast(ForwardedEmbeddingBackend, backend).embed(request)
        ids = await backend.prepare(request)
        keys = [(item, request.truncate) for item in request.inputs]
        found = [cache.get(key) if cache.size else None for key in keys]
        missing = [i for i, hit in enumerate(found) if hit is None]
        rows: dict[int, np.ndarray] = {i: hit[0] for i, hit in enumerate(found) if hit is not None}
        if missing:
            batcher = lease.replica.batcher
            wanted = [ids[i] for i in missing]
            computed = await (batcher.run(wanted) if batcher else backend.embed_tokens(wanted))
            for i, row in zip(missing, computed, strict=True):
                rows[i] = row
                cache.put(keys[i], row.copy(), len(ids[i]))  # a copy: a view would pin the whole batch
        counts = tuple(len(i) for i in ids)
        vectors = np.stack([rows[i] for i in range(len(ids))]).astype(np.float32, copy=False)
        return EmbeddingResult(vectors, sum(counts), counts)

    async def _start(
        self, lease: Lease, run: Callable[[Backend], AsyncIterator[GenerationChunk]], *, owns_lease: bool
    ) -> GenerationStream:
        try:
            chunks = run(lease.backend)
        except BaseException:
            if owns_lease:
                lease.release()
            raise
        on_done = partial(self.metrics.observe_timing, lease.model_id)
        stream = GenerationStream(chunks, lease, self.clock, on_done, owns_lease=owns_lease)
        await stream.prefetch()
        return stream

    async def transcribe(
        self, name: str, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[Segment]:
        """Segments of the transcript as they are decoded, on one turn of the model."""
        slot = self.slot_for(name, Task.TRANSCRIPTION, options)
        lease = await slot.lease(self.model_wait_s, options.keep_alive)
        backend = cast(TranscriptionBackend, lease.backend)
        audio_s = len(request.audio) / backend.sample_rate
        on_close = self._audio_observer(slot.id, "transcription", lease, lambda: audio_s)
        return await self._leased(lease, lambda: backend.transcribe(request), on_close)

    async def speak(
        self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[npt.NDArray[np.int16]]:
        """Speech, a sentence of samples at a time, on one turn of the model."""
        slot = self.slot_for(name, Task.SPEECH, options)
        lease = await slot.lease(self.model_wait_s, options.keep_alive)
        backend = cast(SpeechBackend, lease.backend)
        produced = [0]

        async def counted() -> AsyncIterator[npt.NDArray[np.int16]]:
            async for pcm in backend.synthesize(request):
                produced[0] += len(pcm)
                yield pcm

        on_close = self._audio_observer(slot.id, "speech", lease, lambda: produced[0] / backend.sample_rate)
        return await self._leased(lease, counted, on_close)

    def _audio_observer(
        self, model: str, task: str, lease: Lease, audio_seconds: Callable[[], float]
    ) -> Callable[[], None]:
        started = self.clock.monotonic()

        def observe() -> None:
            busy = self.clock.monotonic() - started
            lease.timing.backend_s = busy
            self.metrics.observe_audio(model, task, audio_seconds(), busy)

        return observe

    async def _leased(self, lease: Lease, start: Callable[[], AsyncIterator[T]], on_close: Callable[[], None]):
        try:
            items = start()
        except BaseException:
            lease.release()
            raise
        stream: LeasedStream[T] = LeasedStream(items, lease, on_close)
        await stream.prefetch()
        return stream

    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> list[Loglikelihood]:
        """Score each (prompt, continuation) on one turn of the model."""
        lease = await self.lease(name, Task.SCORING, options)
        try:
            backend = cast(ScoringBackend, lease.backend)
            return [await loglikelihood(backend, prompt, cont, i) for i, (prompt, cont) in enumerate(pairs)]
        finally:
            lease.release()

    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> list[Generation]:
        """Generate for every prompt on one turn of the model, all at once: an engine that
        batches (transformers) runs them together, one that does not runs them in turn."""
        lease = await self.lease(name, Task.COMPLETION, options)

        async def one(request: CompletionRequest) -> Generation:
            stream = await self.complete_on(lease, request)
            try:
                return await collect(stream)
            finally:
                await stream.aclose()

        try:
            return list(await asyncio.gather(*(one(r) for r in requests)))
        finally:
            lease.release()

    # ----- admin ---------------------------------------------------------------------

    async def load(self, name: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None) -> None:
        """Load (or reload with live option overrides, or rescale) a model. Config files are
        never rewritten: overrides last until the next unload-and-reload or restart."""
        slot = self.slot(name)
        if replicas is not None and not 1 <= replicas <= slot.config.replica_max:
            raise InvalidRequest(
                f"replicas must be between 1 and replica_max ({slot.config.replica_max})", param="replicas"
            )
        if overrides:
            await slot.reconfigure(self._with_overrides(slot.config, overrides))
        if replicas is not None and replicas != slot.config.replicas:
            await slot.scale(replicas)
        slot.forgive_crashes()
        await slot.ensure_ready(None, load_if_unloaded=True)

    async def unload(self, name: str, *, drain: bool = True) -> None:
        await self.slot(name).unload(drain=drain)

    def _with_overrides(self, config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
        allowed = backend_class(config.backend).overridable
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise InvalidRequest(
                f"backend '{config.backend}' cannot override {', '.join(unknown)} at load time "
                f"(it can: {', '.join(sorted(allowed))})",
                param="overrides",
            )
        candidate = config.model_copy(update={"options": {**config.options, **overrides}})
        try:
            parse_options(candidate)
        except ConfigError as exc:
            raise InvalidRequest(exc.message, param="overrides") from None
        return candidate


def build_pool(config: Config, *, metrics: Metrics | None = None, clock: Clock | None = None) -> ModelPool:
    """A pool of the config's served models; bad backends or options fail here, before loading."""
    metrics = metrics or Metrics()
    clock = clock or SystemClock()
    hub = HubLocation(config.hf_cache_dir, config.offline, config.work_dir or HubLocation.work_dir, config.state_dir)
    slots = []
    for model in config.served_models():
        parse_options(model)

        def make(cfg: ModelConfig) -> Backend:
            return build_backend(cfg, parse_options(cfg), hub)

        remote = bool(getattr(backend_class(model.backend), "remote", False))
        slots.append(ModelSlot(model, model_tasks(model), make, metrics, clock, remote=remote))
    budget = Budget(
        max_models=config.pool.max_loaded_models,
        memory_bytes=config.pool.memory_budget_bytes,
        gpu_bytes=config.pool.gpu_memory_budget_bytes,
    )
    return ModelPool(
        slots,
        metrics,
        model_wait_s=config.server.model_wait_s,
        budget=budget,
        clock=clock,
        reap_interval_s=config.pool.reap_interval_s,
    )
