"""Fakes for fast, deterministic runtime tests (no sleeps: a test opens an asyncio.Event when
it wants a load or a step to finish, and moves the clock by hand), and `EchoBackend`, the
smallest complete backend: everything a backend declares, in one class."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.registry import model_capabilities
from modelpool.capabilities import Capabilities, Locality, ModelCapabilities
from modelpool.config.schema import ModelConfig
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    SamplingParams,
    Segment,
    TranscriptionRequest,
    Usage,
)
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.clock import Clock
from modelpool.runtime.eviction import Budget
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot
from modelpool.runtime.slot_work import CapacityGate
from modelpool.tasks import Task


class EchoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefix: str = ""
    """Put before every answer."""


class EchoBackend:
    """The smallest complete backend: chat that answers the last message back, word by word.
    Use it as `backend: tests.fakes:EchoBackend`. A backend class declares four things and
    its instances implement `Backend` plus the Protocol of each task it declares."""

    Options = EchoOptions
    capabilities = Capabilities(tasks=frozenset({Task.CHAT}), needs_source=False)
    overridable = frozenset({"prefix"})

    @classmethod
    def capabilities_for(cls, options: EchoOptions) -> Capabilities:
        return cls.capabilities

    def __init__(self, model: ModelConfig, options: EchoOptions, context: BackendContext) -> None:
        self.prefix = options.prefix

    async def estimate_memory(self) -> MemoryEstimate:
        return MemoryEstimate(0)

    async def start(self) -> None:
        return None

    async def warmup(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def check_health(self) -> None:
        return None

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        words = (self.prefix + request.messages[-1].content).split()
        yield GenerationChunk()  # early, so request problems can still be a 4xx
        for word in words:
            yield GenerationChunk(word + " ")
        yield GenerationChunk(finish_reason="stop", usage=Usage(len(request.messages), len(words)))


class HeldEchoBackend(EchoBackend):
    """EchoBackend that, once `HeldEchoBackend.gate` is set to an unset event, waits for it
    after each word: a test holds a stream open mid-answer (`backend: tests.fakes:HeldEchoBackend`)."""

    gate: asyncio.Event | None = None

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        async for chunk in super().chat(request):
            yield chunk
            if chunk.text and HeldEchoBackend.gate is not None:
                await HeldEchoBackend.gate.wait()


class BrokenEchoBackend(EchoBackend):
    """Declares embeddings but implements none of them: the load must fail, naming what lacks."""

    capabilities = Capabilities(tasks=frozenset({Task.CHAT, Task.EMBEDDING}), needs_source=False)


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeOptions(BaseModel):
    model_config = ConfigDict(extra="allow")


class FakeBackend:
    """A controllable chat and embedding backend (built by the tests, not by the registry)."""

    Options = FakeOptions
    capabilities = Capabilities(tasks=frozenset({Task.CHAT, Task.EMBEDDING}), engine_concurrency=8)
    """Runs several requests at once, so `max_concurrency` in a test's config is the limit."""
    overridable = frozenset({"speed"})
    dimensions = 3

    @classmethod
    def capabilities_for(cls, options: FakeOptions) -> Capabilities:
        return cls.capabilities

    def __init__(
        self,
        gate: asyncio.Event | None = None,
        fail_with: Exception | None = None,
        memory: int = 100,
        step: asyncio.Event | None = None,
    ) -> None:
        self.gate = gate
        self.fail_with = fail_with
        self.memory = memory
        self.step = step
        """When set, chat waits for it before each word (tests hold generations open)."""
        self.starts = 0
        self.stops = 0
        self.warmups = 0
        self.embed_calls: list[int] = []
        self.words_sent = 0

    async def estimate_memory(self) -> MemoryEstimate:
        return MemoryEstimate(self.memory)

    async def start(self) -> None:
        self.starts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with

    async def warmup(self) -> None:
        self.warmups += 1

    async def stop(self) -> None:
        self.stops += 1

    async def check_health(self) -> None:
        return None

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        yield GenerationChunk()
        words = request.messages[-1].content.split()
        for word in words:
            if self.step is not None:
                await self.step.wait()
            self.words_sent += 1
            yield GenerationChunk(word + " ")
        yield GenerationChunk(finish_reason="stop", usage=Usage(len(words), len(words)))

    async def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        return [[len(item)] if isinstance(item, str) else list(item) for item in request.inputs]

    async def embed_tokens(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        self.embed_calls.append(len(ids))
        if self.fail_with is not None:
            raise self.fail_with
        return np.array([[float(i[0]), 1.0, 0.0] for i in ids], dtype=np.float32)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        ids = await self.prepare(request)
        return EmbeddingResult(await self.embed_tokens(ids), prompt_tokens=len(ids))

    def concurrent_batches(self) -> int:
        return 1


def model_config(model_id: str = "fake", **fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"id": model_id, "backend": "tests.fakes:FakeBackend", "source": "/nowhere",
                                       **fields})  # fmt: skip


class SamplingRecorder(FakeBackend):
    """Answers "ok" and keeps the sampling of every chat and completion it was sent: what
    the pool's defaults and checks made of the request's."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[SamplingParams] = []

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        self.seen.append(request.sampling)
        yield GenerationChunk("ok", finish_reason="stop")

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        self.seen.append(request.sampling)
        yield GenerationChunk("ok", finish_reason="stop")


def fake_slot(
    backend: FakeBackend | list[FakeBackend],
    model_id: str = "fake",
    metrics: Metrics | None = None,
    clock: Clock | None = None,
    capacity: CapacityGate | None = None,
    tasks: frozenset[Task] = frozenset({Task.CHAT}),
    **fields: object,
) -> ModelSlot:
    """A slot whose backends are the given fakes (one per replica start, reused if fewer)."""
    backends = backend if isinstance(backend, list) else [backend]
    made = iter(range(10_000))

    def make(_: ModelConfig) -> FakeBackend:
        return backends[min(next(made), len(backends) - 1)]

    config = model_config(model_id, **{"warmup": False, **fields})
    declared = type(backends[0]).capabilities
    capabilities = ModelCapabilities(tasks, declared, overridable=FakeBackend.overridable)
    return ModelSlot(config, capabilities, make, metrics or Metrics(), clock or ManualClock(), capacity)


class FakePool:
    """Slots made for one pool, sharing its capacity gate (so budgets and eviction apply)."""

    def __init__(self, clock: ManualClock | None = None, metrics: Metrics | None = None, **budget: int) -> None:
        self.clock = clock or ManualClock()
        self.metrics = metrics or Metrics()
        self.slots: list[ModelSlot] = []
        self.capacity = Capacity(Budget(**budget), lambda: self.slots)

    def slot(self, backend: FakeBackend | list[FakeBackend], model_id: str = "fake", **fields: object) -> ModelSlot:
        made = fake_slot(backend, model_id, self.metrics, self.clock, self.capacity, **fields)  # type: ignore[arg-type]
        self.slots.append(made)
        return made

    def pool(self, model_wait_s: float | None = None) -> ModelPool:
        return ModelPool(self.slots, self.metrics, self.capacity, self.clock, model_wait_s=model_wait_s,
                         resolve=model_capabilities)  # fmt: skip


def pool_of(*slots: ModelSlot, model_wait_s: float | None = None) -> ModelPool:
    """A pool of ready-made slots, with no budget."""
    first = slots[0]
    listed = list(slots)
    return ModelPool(listed, first._metrics, Capacity(Budget(), lambda: listed), first._clock,
                     model_wait_s=model_wait_s, resolve=model_capabilities)  # fmt: skip


class FakeProcessBackend(FakeBackend):
    """A fake whose "engine process" can be made to crash (`crash()`), as a ProcessBackend."""

    capabilities = replace(FakeBackend.capabilities, locality=Locality.ENGINE_PROCESS)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]  # the same keywords as FakeBackend
        self.pid: int | None = None
        self.port: int | None = 9999
        self.detaches = 0
        self._on_crash: Callable[[str], None] | None = None

    async def start(self) -> None:
        await super().start()
        self.pid = 1000 + self.starts

    def supervise(self, on_crash: Callable[[str], None]) -> None:
        self._on_crash = on_crash

    def crash(self) -> None:
        assert self._on_crash is not None
        self._on_crash(f"engine process (pid {self.pid}) was killed by signal 9")

    def resident_bytes(self) -> int:
        return 4242

    def log_tail(self, count: int) -> list[str]:
        return [f"line {i} of pid {self.pid}" for i in range(3)][-count:]

    async def detach(self) -> None:
        self.detaches += 1


class SampleCountingTranscriber(EchoBackend):
    """Transcribes audio into the number of samples it got: shows the rate the pool decoded
    the upload at, which must be the one the backend declares."""

    capabilities = Capabilities(tasks=frozenset({Task.TRANSCRIPTION}), needs_source=False, audio_input_rate=8000)

    async def transcribe(self, request: TranscriptionRequest) -> AsyncGenerator[Segment, None]:
        yield Segment(0, 0.0, len(request.audio) / 8000, str(len(request.audio)))
