"""A controllable in-memory backend for fast, deterministic runtime tests (no sleeps:
the test opens an asyncio.Event when it wants the load to finish)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from modelpool.backends.base import (
    ChatRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    Limits,
    Usage,
)
from modelpool.config.schema import ModelConfig
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.slot import ModelSlot
from modelpool.tasks import Task


class FakeBackend:
    tasks = frozenset({Task.CHAT, Task.EMBEDDING})
    limits = Limits()
    dimensions = 3

    def __init__(self, gate: asyncio.Event | None = None, fail_with: Exception | None = None) -> None:
        self.gate = gate
        self.fail_with = fail_with
        self.starts = 0
        self.stops = 0

    async def start(self) -> None:
        self.starts += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with

    async def stop(self) -> None:
        self.stops += 1

    async def check_health(self) -> None:
        return None

    async def chat(self, request: ChatRequest) -> AsyncIterator[GenerationChunk]:
        words = request.messages[-1].content.split()
        for word in words:
            yield GenerationChunk(word + " ")
        yield GenerationChunk(finish_reason="stop", usage=Usage(len(words), len(words)))

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        vectors = np.ones((len(request.inputs), self.dimensions), dtype=np.float32)
        return EmbeddingResult(vectors, prompt_tokens=len(request.inputs))


def model_config(model_id: str = "fake", **fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"id": model_id, "backend": "fake", "source": "/nowhere", **fields})


def fake_slot(backend: FakeBackend, model_id: str = "fake", metrics: Metrics | None = None, **fields: object):
    config = model_config(model_id, **fields)
    return ModelSlot(config, FakeBackend.tasks, lambda: backend, metrics or Metrics())
