"""A controllable in-memory backend and clock for fast, deterministic runtime tests (no
sleeps: a test opens an asyncio.Event when it wants a load or a step to finish, and moves
the clock by hand)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np

from modelpool.backends.base import (
    ChatRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    Limits,
    MemoryEstimate,
    Usage,
)
from modelpool.config.schema import ModelConfig
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.slot import CapacityGate, ModelSlot
from modelpool.tasks import Task


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeBackend:
    tasks = frozenset({Task.CHAT, Task.EMBEDDING})
    limits = Limits()
    dimensions = 3
    overridable = frozenset({"speed"})

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

    async def chat(self, request: ChatRequest) -> AsyncIterator[GenerationChunk]:
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

    async def embed_tokens(self, ids: list[list[int]]) -> np.ndarray:
        self.embed_calls.append(len(ids))
        if self.fail_with is not None:
            raise self.fail_with
        return np.array([[float(i[0]), 1.0, 0.0] for i in ids], dtype=np.float32)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        ids = await self.prepare(request)
        return EmbeddingResult(await self.embed_tokens(ids), prompt_tokens=len(ids))


def model_config(model_id: str = "fake", **fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"id": model_id, "backend": "fake", "source": "/nowhere", **fields})


def fake_slot(
    backend: FakeBackend | list[FakeBackend],
    model_id: str = "fake",
    metrics: Metrics | None = None,
    clock: ManualClock | None = None,
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
    return ModelSlot(config, tasks, make, metrics or Metrics(), clock or ManualClock(), capacity)


class FakeProcessBackend(FakeBackend):
    """A fake whose "engine process" can be made to crash (`crash()`), as a ProcessBackend."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.pid: int | None = None
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
