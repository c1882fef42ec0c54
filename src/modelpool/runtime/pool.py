"""The pool as a library: the served models, found by id or alias, and the one way in
for every request (task check → ready backend → a turn → run)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import cast

from modelpool.backends.base import (
    Backend,
    ChatBackend,
    ChatRequest,
    CompletionBackend,
    CompletionRequest,
    EmbeddingBackend,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    Usage,
)
from modelpool.backends.registry import build_backend, model_tasks, parse_options
from modelpool.config.schema import Config
from modelpool.config.sources import HubLocation
from modelpool.errors import ModelNotFound, ShuttingDown, UnsupportedTask
from modelpool.runtime.generation import GenerationStream
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.slot import ModelSlot, SlotState
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")


class ModelPool:
    def __init__(self, slots: list[ModelSlot], metrics: Metrics, *, model_wait_s: float | None) -> None:
        self.metrics = metrics
        self.model_wait_s = model_wait_s
        self._slots = {slot.id: slot for slot in slots}
        self._names = {name: slot for slot in slots for name in [slot.id, *slot.config.aliases]}
        self._closing = False

    def slots(self) -> list[ModelSlot]:
        return list(self._slots.values())

    def slot(self, name: str) -> ModelSlot:
        try:
            return self._names[name]
        except KeyError:
            raise ModelNotFound(name, list(self._slots)) from None

    def metrics_label(self, name: str) -> str:
        """The model label for metrics: the canonical id, or "unknown" so that clients cannot
        grow the label set without bound by inventing model names."""
        slot = self._names.get(name)
        return slot.id if slot is not None else "unknown"

    def slot_for(self, name: str, task: Task) -> ModelSlot:
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        slot = self.slot(name)
        if task not in slot.tasks:
            can = ", ".join(sorted(t.value for t in slot.tasks))
            raise UnsupportedTask(f"model '{slot.id}' does not do {task.value} (it does: {can})", param="model")
        return slot

    async def preload(self) -> None:
        """Load every `preload: true` model; failures are kept on their slots, not raised."""
        wanted = [slot for slot in self._slots.values() if slot.config.preload]
        await asyncio.gather(*(slot.ensure_ready(None) for slot in wanted), return_exceptions=True)

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, model → state) where ready means every preloaded model is ready."""
        states = {slot.id: slot.state.value for slot in self._slots.values()}
        ready = not self._closing and all(
            slot.state is SlotState.READY for slot in self._slots.values() if slot.config.preload
        )
        return ready, states

    async def close(self) -> None:
        self._closing = True
        await asyncio.gather(*(slot.unload() for slot in self._slots.values()), return_exceptions=True)

    async def chat(self, name: str, request: ChatRequest) -> GenerationStream:
        return await self._generate(name, Task.CHAT, lambda b: cast(ChatBackend, b).chat(request))

    async def complete(self, name: str, request: CompletionRequest) -> GenerationStream:
        return await self._generate(name, Task.COMPLETION, lambda b: cast(CompletionBackend, b).complete(request))

    async def embed(self, name: str, request: EmbeddingRequest) -> EmbeddingResult:
        slot = self.slot_for(name, Task.EMBEDDING)
        backend, release = await slot.acquire(self.model_wait_s)
        try:
            result = await cast(EmbeddingBackend, backend).embed(request)
        finally:
            release()
        self.metrics.count_tokens(slot.id, input_tokens=result.prompt_tokens, output_tokens=0)
        return result

    async def _generate(
        self, name: str, task: Task, run: Callable[[Backend], AsyncIterator[GenerationChunk]]
    ) -> GenerationStream:
        slot = self.slot_for(name, task)
        backend, release = await slot.acquire(self.model_wait_s)
        try:
            chunks = run(backend)
        except BaseException:
            release()
            raise
        stream = GenerationStream(slot.id, chunks, release, partial(self._count_usage, slot.id))
        await stream.prefetch()
        return stream

    def _count_usage(self, model_id: str, usage: Usage) -> None:
        self.metrics.count_tokens(model_id, input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


def build_pool(config: Config, *, metrics: Metrics | None = None) -> ModelPool:
    """A pool of the config's served models; bad backends or options fail here, before loading."""
    metrics = metrics or Metrics()
    hub = HubLocation(config.hf_cache_dir, config.offline)
    slots = []
    for model in config.served_models():
        options = parse_options(model)
        make = partial(build_backend, model, options, hub)
        slots.append(ModelSlot(model, model_tasks(model), make, metrics))
    return ModelPool(slots, metrics, model_wait_s=config.server.model_wait_s)
