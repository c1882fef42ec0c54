"""The pool as a library: the served models, found by id or alias, the one way in for
every request (task check → lease → run), status snapshots, and idle reaping.

Every request method takes a turn of the model (a `Lease`) and either gives it back by
leaving `async with lease:` or hands it to the `LeasedStream` it returns, which gives it
back when closed. The API only calls these methods and renders what they return.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from modelpool.audio.decode import count_audio, fill_audio
from modelpool.backends.base import (
    Backend,
    ChatBackend,
    CompletionBackend,
    EmbeddingBackend,
    PairScoringBackend,
    ScoringBackend,
    SpeechBackend,
    TokenizerBackend,
    TranscriptionBackend,
)
from modelpool.capabilities import Locality, ModelCapabilities
from modelpool.config.schema import ModelConfig, SamplingDefaults
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
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    PairScoreRequest,
    PairScores,
    Segment,
    SpeechRequest,
    TranscriptionRequest,
    Voice,
)
from modelpool.media.images import ImagePolicy
from modelpool.offload import AUDIO_DECODES, all_or_none
from modelpool.runtime.audio_budget import AudioBudget
from modelpool.runtime.call import CallOptions, check_keep_alive
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.clock import Clock
from modelpool.runtime.embedding import embed_on
from modelpool.runtime.eviction import Budget
from modelpool.runtime.generation import ChoiceChunk, Generation, collect
from modelpool.runtime.images import with_loaded_images
from modelpool.runtime.lease import Lease, LeasedStream, ResultStream, open_stream
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.memory import gpu_memory, system_memory
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.observers import RequestObservers
from modelpool.runtime.option_schema import check_override
from modelpool.runtime.pairs import cosine_on, cross_encode_on
from modelpool.runtime.scoring import Loglikelihood, loglikelihood
from modelpool.runtime.slot import ModelSlot
from modelpool.runtime.status import BudgetStatus, EngineLogs, ModelMemory, ModelStatus, PoolMemory
from modelpool.runtime.timing import RequestTiming
from modelpool.runtime.tokenization import Detokenized, Tokenized, TokenizeJob, tokenize_on, tokenizer_slot
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")
B = TypeVar("B", bound=Backend)
R = TypeVar("R", bound="_Counted")
DEFAULT_CALL = CallOptions()
DEFAULT_AUDIO_WAIT_S = 120.0
"""How long a transcription waits for its share of the decoded-audio budget when the pool
sets no model wait."""


class _Counted(Protocol):
    """A result that says how many prompt tokens it took."""

    @property
    def prompt_tokens(self) -> int: ...


@dataclass(frozen=True)
class Transcription:
    segments: ResultStream[Segment]
    audio_seconds: float


@dataclass(frozen=True)
class SpeechAudio:
    chunks: ResultStream[npt.NDArray[np.int16]]
    """Mono int16 samples, a sentence at a time."""
    sample_rate: int


@dataclass(frozen=True)
class ModelVoice:
    model: str
    voice: Voice


class ModelPool:
    def __init__(
        self,
        slots: list[ModelSlot],
        metrics: Metrics,
        capacity: Capacity,
        clock: Clock,
        *,
        model_wait_s: float | None,
        resolve: Callable[[ModelConfig], ModelCapabilities],
        reap_interval_s: float = 1.0,
        images: ImagePolicy | None = None,
        max_audio_seconds: float | None = None,
        audio_budget_s: float | None = None,
    ) -> None:
        """`resolve(config)` gives a config's capabilities (checking its options): admin
        overrides are checked with it before they replace a model's settings."""
        self.metrics = metrics
        self.model_wait_s = model_wait_s
        self.capacity = capacity
        self.clock = clock
        self.observe = RequestObservers(metrics, clock)
        self.reap_interval_s = reap_interval_s
        self.images = images or ImagePolicy()
        """Where images in requests may come from, and their limits."""
        self.max_audio_seconds = max_audio_seconds
        """Longest audio one transcription may decode to (None: no limit)."""
        self.audio_budget = AudioBudget(audio_budget_s) if audio_budget_s is not None else None
        """Decoded audio all transcriptions may hold at once (None: no limit)."""
        self._resolve = resolve
        self._slots = {slot.id: slot for slot in slots}
        self._configured = {slot.id: slot.config for slot in slots}
        """Each model as the config file says, before any override: what overrides may not widen."""
        self._names = {name: slot for slot in slots for name in [slot.id, *slot.config.aliases]}
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False

    @property
    def closing(self) -> bool:
        """Closing or closed: new work is refused."""
        return self._closing

    @property
    def budget(self) -> Budget:
        return self.capacity.budget

    # ----- lookup --------------------------------------------------------------------

    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def slot(self, name: str) -> ModelSlot:
        try:
            return self._names[name]
        except KeyError:
            raise ModelNotFound(name, list(self._slots)) from None

    def model_id(self, name: str) -> str:
        """The canonical id of the model `name` names (an id or an alias)."""
        return self.slot(name).id

    def sampling_defaults(self, name: str) -> SamplingDefaults:
        return self.slot(name).config.sampling

    def slot_for(self, name: str, task: Task, options: CallOptions = DEFAULT_CALL) -> ModelSlot:
        """The slot that serves `name` for `task`, once the request may use it."""
        slot = self.slot(name)
        if task not in slot.tasks:
            can = ", ".join(sorted(t.value for t in slot.tasks))
            raise UnsupportedTask(f"model '{slot.id}' does not do {task.value} (it does: {can})", param="model")
        if slot.capabilities.remote and not (options.allow_remote or slot.config.allow_remote):
            raise RemoteNotAllowed(
                f"model '{slot.id}' is served by a remote upstream; send `allow_remote: true` with the request "
                "(or set `allow_remote: true` on the model) to use it",
                param="allow_remote",
            )
        check_keep_alive(options, slot.config)
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
        await asyncio.gather(*(slot.ensure_ready(None, explicit=True) for slot in wanted), return_exceptions=True)

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
            reasons = "; ".join(f"model '{slot.id}' failed to load: {slot.record.error}" for slot in failed)
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

    async def lease(
        self, name: str, task: Task, protocol: type[B], options: CallOptions = DEFAULT_CALL, *, size: int = 1
    ) -> Lease[B]:
        """A turn on a ready replica of the model `name` names, for `task` (whose Protocol
        is `protocol`), `size` turns for a batch run at once. Leave it with `async with`, or
        hand it to a stream."""
        slot = self.slot_for(name, task, options)
        return await slot.lease(protocol, self.model_wait_s, options.keep_alive, size=size)

    async def chat(
        self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[GenerationChunk]:
        slot = self.slot_for(name, Task.CHAT, options)
        _check_chat_features(slot, request)
        request = await with_loaded_images(request, slot.id, slot.capabilities.declared, self.images)
        lease = await slot.lease(ChatBackend, self.model_wait_s, options.keep_alive)

        def run(backend: ChatBackend) -> AsyncGenerator[GenerationChunk, None]:
            return backend.chat(request)  # reasoning is split inside the backend (textgen.pipeline)

        observe = self.observe.chunks(lease.model_id, lease.timing)
        return await open_stream(lease, run, observe=observe, on_close=self.observe.finished(slot.id))

    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[ChoiceChunk]:
        """Every prompt's completion on one turn of the model, one after another, each
        chunk with its prompt's index. The first prompt starts before this returns, so a
        bad request still gets a 4xx; later ones start when reached."""
        lease = await self.lease(name, Task.COMPLETION, CompletionBackend, options)
        timer = self.observe.chunks(lease.model_id, lease.timing)

        async def each(backend: CompletionBackend) -> AsyncGenerator[ChoiceChunk, None]:
            for index, request in enumerate(requests):
                async with aclosing(backend.complete(request)) as chunks:
                    async for chunk in chunks:
                        yield index, chunk

        def observe(piece: ChoiceChunk) -> None:
            timer(piece[1])

        return await open_stream(lease, each, observe=observe, on_close=self.observe.finished(lease.model_id))

    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[EmbeddingResult, RequestTiming]:
        slot = self.slot_for(name, Task.EMBEDDING, options)
        return await self._timed(slot, EmbeddingBackend, options, len(request.inputs),
                                 lambda lease: embed_on(lease, slot.embedding_cache, request))  # fmt: skip

    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[PairScores, RequestTiming]:
        """Relevance of each pair (rerank, score): by a reranker (task `rerank`), or by any
        embedding model as the cosine of the two texts' embeddings."""
        found = self.slot(name)
        if Task.EMBEDDING in found.tasks and Task.RERANK not in found.tasks:
            slot = self.slot_for(name, Task.EMBEDDING, options)
            return await self._timed(slot, EmbeddingBackend, options, len(request.pairs),
                                     lambda lease: cosine_on(lease, slot.embedding_cache, request))  # fmt: skip
        slot = self.slot_for(name, Task.RERANK, options)
        return await self._timed(slot, PairScoringBackend, options, len(request.pairs),
                                 lambda lease: cross_encode_on(lease, request))  # fmt: skip

    async def _timed(
        self,
        slot: ModelSlot,
        protocol: type[B],
        options: CallOptions,
        size: int,
        run: Callable[[Lease[B]], Awaitable[R]],
    ) -> tuple[R, RequestTiming]:
        """`run` on `size` turns of the model (its inputs go into the engine at once), timed
        and counted (the result's `prompt_tokens`)."""
        async with await slot.lease(protocol, self.model_wait_s, options.keep_alive, size=size) as lease:
            try:
                result = await run(lease)
                lease.timing.prompt_tokens = result.prompt_tokens  # before the turn's span ends with it
            finally:
                lease.timing.backend_s = self.clock.monotonic() - lease.timing.started
        self.metrics.observe_timing(slot.id, lease.timing)
        return result, lease.timing

    async def transcribe(
        self, name: str, upload: bytes, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> Transcription:
        """Decode `upload` at the rate the model declares, then its transcript's segments as
        they are decoded, on one turn of the model. Bad audio is a 400 before any waiting."""
        rate = self.transcription_rate(name, options)
        length = await AUDIO_DECODES.run(count_audio, upload, rate, self.max_audio_seconds)
        release = await self._hold_decoded(length / rate)
        try:
            audio = await AUDIO_DECODES.run(fill_audio, upload, rate, length)
            return await self.transcribe_samples(name, audio, request, options, on_close=release)
        except BaseException:
            release()
            raise

    async def _hold_decoded(self, seconds: float) -> Callable[[], None]:
        """A share of the server's decoded-audio budget, held until the transcript closes."""
        if self.audio_budget is None:
            return lambda: None
        wait_s = self.model_wait_s if self.model_wait_s is not None else DEFAULT_AUDIO_WAIT_S
        return await self.audio_budget.take(seconds, wait_s)

    def transcription_rate(self, name: str, options: CallOptions = DEFAULT_CALL) -> int:
        """The sample rate the transcription model `name` wants its audio at (raises
        ModelNotFound / UnsupportedTask for a model that cannot transcribe)."""
        rate = self.slot_for(name, Task.TRANSCRIPTION, options).capabilities.declared.audio_input_rate
        assert rate is not None, "the registry refuses a transcription backend that declares no input rate"
        return rate

    async def transcribe_samples(
        self, name: str, audio: npt.NDArray[np.float32], request: TranscriptionRequest,
        options: CallOptions = DEFAULT_CALL, on_close: Callable[[], None] | None = None,
    ) -> Transcription:  # fmt: skip
        """As `transcribe`, for mono float32 samples already at `transcription_rate(name)`;
        `on_close` runs when the transcript's stream closes."""
        slot = self.slot_for(name, Task.TRANSCRIPTION, options)
        rate = self.transcription_rate(name, options)
        job = replace(request, audio=audio)
        audio_s = len(audio) / rate
        lease = await slot.lease(TranscriptionBackend, self.model_wait_s, options.keep_alive)
        observed = self.observe.audio(slot.id, "transcription", lambda: audio_s)

        def closed(timing: RequestTiming) -> None:
            observed(timing)
            if on_close is not None:
                on_close()

        segments = await open_stream(lease, lambda backend: backend.transcribe(job), on_close=closed)
        return Transcription(segments, audio_s)

    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio:
        """Speech, a sentence of samples at a time, on one turn of the model."""
        lease = await self.lease(name, Task.SPEECH, SpeechBackend, options)
        rate = lease.backend.sample_rate
        produced = [0]

        def count(pcm: npt.NDArray[np.int16]) -> None:
            produced[0] += len(pcm)

        on_close = self.observe.audio(lease.model_id, "speech", lambda: produced[0] / rate)
        chunks = await open_stream(lease, lambda backend: backend.synthesize(request), observe=count, on_close=on_close)
        return SpeechAudio(chunks, rate)

    async def voices(self) -> list[ModelVoice]:
        """The voices of every text-to-speech model, read from each model's files by a
        backend that is never started: listing voices loads and evicts nothing."""
        listed = []
        for slot in self._slots.values():
            if Task.SPEECH in slot.tasks:
                listed += [ModelVoice(slot.id, voice) for voice in await slot.voices()]
        return listed

    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> list[Loglikelihood]:
        """Score each (prompt, continuation) on one turn of the model, its scored tokens
        counted as each is done (the turn's prompt tokens)."""
        async with await self.lease(name, Task.SCORING, ScoringBackend, options) as lease:
            scored = []
            try:
                for i, (prompt, cont) in enumerate(pairs):
                    scored.append(await loglikelihood(lease.backend, prompt, cont, i))
                    lease.timing.prompt_tokens += scored[-1].scored_tokens  # before the turn's span ends with it
                    self.metrics.count_timing(lease.model_id, lease.timing)
            finally:
                self.observe.finished(lease.model_id)(lease.timing)
            return scored

    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> list[Generation]:
        """Generate for every prompt at once, on as many turns of the model (at most all):
        an engine that batches runs them together, one that does not runs them in turn. The
        first that fails (or the caller leaving) stops all the others before this returns."""
        if any(r.output is not None for r in requests):
            _check_structured(self.slot_for(name, Task.COMPLETION, options), "json_schema")
        async with await self.lease(name, Task.COMPLETION, CompletionBackend, options, size=len(requests)) as lease:

            async def one(request: CompletionRequest) -> Generation:
                async with aclosing(lease.backend.complete(request)) as chunks:
                    timer = self.observe.chunks(lease.model_id, lease.timing)  # one per generation
                    return await collect(_observed(chunks, timer, lease))

            try:
                return await all_or_none(requests, one)
            finally:
                self.observe.finished(lease.model_id)(lease.timing)

    async def tokenize(self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL) -> Tokenized:
        """Token ids by the tokenizer of the model `name` names (None: the only model with one)."""
        async with await self._tokenizer_lease(name, options) as lease:
            return await tokenize_on(lease.model_id, lease.backend, job)

    async def detokenize(self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL) -> Detokenized:
        async with await self._tokenizer_lease(name, options) as lease:
            return Detokenized(lease.model_id, await lease.backend.decode_tokens(ids))

    async def _tokenizer_lease(self, name: str | None, options: CallOptions) -> Lease[TokenizerBackend]:
        slot = tokenizer_slot(self.slots(), None if name is None else self.slot(name))
        check_keep_alive(options, slot.config)
        return await slot.lease(TokenizerBackend, self.model_wait_s, options.keep_alive)

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
            config = self.with_overrides(name, overrides)
            await slot.reconfigure(config, self._resolve(config))
        if replicas is not None and replicas != slot.config.replicas:
            await slot.scale(replicas)
        slot.forgive_crashes()
        await slot.ensure_ready(None, explicit=True)

    async def unload(self, name: str, *, drain: bool = True) -> None:
        await self.slot(name).unload(drain=drain)

    def with_overrides(self, name: str, overrides: dict[str, Any]) -> ModelConfig:
        """The config of the model `name` names with live option `overrides`, checked as a
        load would check them (InvalidRequest naming `overrides` if not)."""
        slot = self.slot(name)
        config, allowed = slot.config, slot.capabilities.overridable
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise InvalidRequest(
                f"backend '{config.backend}' cannot override {', '.join(unknown)} at load time "
                f"(it can: {', '.join(sorted(allowed))})",
                param="overrides",
            )
        candidate = config.model_copy(update={"options": {**config.options, **overrides}})
        try:
            self._resolve(candidate)
        except ConfigError as exc:
            raise InvalidRequest(exc.message, param="overrides") from None
        check_override(self._configured[slot.id], candidate)
        return candidate

    # ----- status --------------------------------------------------------------------

    def statuses(self) -> list[ModelStatus]:
        return [slot.status() for slot in self._slots.values()]

    def status(self, name: str) -> ModelStatus:
        return self.slot(name).status()

    async def engine_logs(self, name: str, lines: int) -> EngineLogs:
        """The last output of the model's engine processes; 400 for a model inside modelpool."""
        slot = self.slot(name)
        if slot.capabilities.declared.locality is not Locality.ENGINE_PROCESS:
            raise InvalidRequest(
                f"model '{slot.id}' runs inside modelpool (backend '{slot.config.backend}'); its output is "
                "modelpool's own log",
                param="model",
            )
        return slot.engine_logs(lines)

    def memory(self) -> PoolMemory:
        budget = self.budget
        models = {s.id: ModelMemory(s.state.value, s.memory_bytes(), s.replicas.measured_bytes()) for s in self.slots()}
        return PoolMemory(
            system=system_memory(),
            gpus=gpu_memory(),
            budget=BudgetStatus(budget.max_models, budget.memory_bytes, budget.gpu_bytes),
            models=models,
        )


def _check_chat_features(slot: ModelSlot, request: ChatRequest) -> None:
    """Tools and response formats go only to models whose backend declares them: refused
    here, with the field named, rather than silently ignored."""
    if request.tools and request.tool_choice.mode != "none" and not slot.capabilities.declared.tools:
        raise InvalidRequest(f"model '{slot.id}' does not support tool calling", param="tools")
    if request.output is not None:
        _check_structured(slot, "response_format")


def _check_structured(slot: ModelSlot, param: str) -> None:
    if not slot.capabilities.declared.structured_output:
        raise InvalidRequest(f"model '{slot.id}' does not support structured output", param=param)


async def _observed(
    chunks: AsyncIterator[GenerationChunk], observe: Callable[[GenerationChunk], None], lease: Lease[Any]
) -> AsyncGenerator[GenerationChunk, None]:
    async for chunk in chunks:
        lease.check_revoked()
        observe(chunk)
        yield chunk

