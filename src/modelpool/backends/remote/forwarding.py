"""The task methods of a backend whose model runs on an OpenAI-compatible server: an engine
process modelpool manages, or a remote upstream. Requests are translated to the wire
format and the upstream's stream is passed back chunk by chunk, never buffered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from modelpool.backends.base import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    Limits,
)
from modelpool.backends.remote import wire
from modelpool.backends.remote.client import UpstreamClient
from modelpool.errors import UpstreamUnavailable
from modelpool.tasks import Task

Translate = Callable[[AsyncIterator[dict[str, Any]]], AsyncIterator[GenerationChunk]]
TranslateWhole = Callable[[dict[str, Any]], list[GenerationChunk]]


class ForwardingBackend:
    """Chat, completions and embeddings through `self.upstream`. Subclasses open the
    client in `start()` and say which model name the upstream knows the model by."""

    tasks: frozenset[Task]
    limits: Limits
    upstream: UpstreamClient | None = None
    upstream_model: str = ""

    def client(self) -> UpstreamClient:
        if self.upstream is None:
            raise UpstreamUnavailable("the model's upstream is not running (the model is not loaded)")
        return self.upstream

    def chat(self, request: ChatRequest) -> AsyncIterator[GenerationChunk]:
        body = wire.chat_body(request, self.upstream_model)
        if request.streamed:
            return self._forward("chat/completions", body, wire.chat_chunks)
        return self._whole("chat/completions", body, wire.chat_whole)

    def complete(self, request: CompletionRequest) -> AsyncIterator[GenerationChunk]:
        body = wire.completion_body(request, self.upstream_model)
        if request.streamed:
            return self._forward("completions", body, wire.completion_chunks)
        return self._whole("completions", body, wire.completion_whole)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        payload = await self.client().post_json("embeddings", wire.embeddings_body(request.inputs, self.upstream_model))
        vectors = wire.embedding_vectors(payload, len(request.inputs))
        usage = wire.usage_of(payload)
        return EmbeddingResult(vectors, usage.prompt_tokens if usage else 0)

    async def _forward(self, path: str, body: dict[str, Any], translate: Translate) -> AsyncIterator[GenerationChunk]:
        events = await self.client().stream_events(path, body)  # 4xx raise here, before any chunk
        # Closing this generator closes both below it, and so the upstream response: the
        # upstream stops generating when our client leaves.
        async with aclosing(events), aclosing(translate(events)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _whole(
        self, path: str, body: dict[str, Any], translate: TranslateWhole
    ) -> AsyncIterator[GenerationChunk]:
        """A client that wants the whole answer: one plain upstream response, no stream."""
        for chunk in translate(await self.client().post_json(path, body)):
            yield chunk
