"""The pool's text, embedding, scoring and tokenizer requests.

Each takes a turn of the model (a `Lease`) and either gives it back by leaving
`async with lease:` (a whole result: an `Outcome` with its timing and usage) or hands it to
the `LeasedStream` it returns, which gives it back when closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from modelpool.backends.base import (
    ChatBackend,
    CompletionBackend,
    EmbeddingBackend,
    PairScoringBackend,
    ScoringBackend,
    TokenizerBackend,
)
from modelpool.errors import InvalidRequest, ModelpoolError, carry_usage
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    PairScoreRequest,
    PairScores,
)
from modelpool.offload import all_or_none
from modelpool.pool_api.call import DEFAULT_CALL, CallOptions
from modelpool.pool_api.generation import ChoiceChunk, Generation, collect
from modelpool.pool_api.results import Detokenized, Loglikelihood, Outcome, Tokenized, TokenizeJob
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.adapters import split_adapter
from modelpool.runtime.keep_alive import check_keep_alive
from modelpool.runtime.lease import Lease, LeasedStream, open_stream
from modelpool.runtime.pool_base import PoolBase
from modelpool.runtime.sampling import beam_bounded, check_beam, with_model_defaults, with_thinking_default
from modelpool.runtime.slot import ModelSlot
from modelpool.runtime.tasks.embedding import embed_on
from modelpool.runtime.tasks.images import with_loaded_images
from modelpool.runtime.tasks.pairs import cosine_on, cross_encode_on
from modelpool.runtime.tasks.scoring import loglikelihood
from modelpool.runtime.tasks.tokenization import tokenize_on, tokenizer_slot
from modelpool.runtime.tasks.videos import with_loaded_videos
from modelpool.tasks import Task


class TextRequests(PoolBase):
    async def chat(
        self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[GenerationChunk]:
        name, adapter = split_adapter(self._names, name, request.adapter)
        request = replace(request, adapter=adapter)
        slot = self.slot_for(name, Task.CHAT, options)
        _check_chat_features(slot, request)
        sampling = beam_bounded(with_model_defaults(request.sampling, slot.config.sampling), slot)
        request = replace(request, sampling=sampling)
        request = with_thinking_default(request, slot.config.enable_thinking)
        request = await with_loaded_images(request, slot.id, slot.capabilities.declared, self.images)
        request = await with_loaded_videos(request, slot.id, slot.capabilities.declared, self.videos)
        lease = await slot.lease(ChatBackend, self.model_wait_s, options.keep_alive, schedule=options.schedule)

        def run(backend: ChatBackend) -> AsyncGenerator[GenerationChunk, None]:
            return backend.chat(request)  # reasoning is split inside the backend (textgen.pipeline)

        usage = RequestUsage()
        observe = self.observe.chunks(lease.model_id, lease.timing, usage)
        return await open_stream(
            lease, run, observe=observe, on_close=self.observe.finished(slot.id, usage), usage=usage
        )

    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> LeasedStream[ChoiceChunk]:
        """Every prompt's completion on one turn of the model, one after another, each
        chunk with its prompt's index. The first prompt starts before this returns, so a
        bad request still gets a 4xx; later ones start when reached."""
        name, adapter = split_adapter(self._names, name, requests[0].adapter if requests else None)
        requests = [replace(r, adapter=adapter) for r in requests]
        self._check_beams(name, requests, options)
        requests = self._defaulted(name, requests)
        lease = await self.lease(name, Task.COMPLETION, CompletionBackend, options)
        usage = RequestUsage()
        timer = self.observe.chunks(lease.model_id, lease.timing, usage)

        async def each(backend: CompletionBackend) -> AsyncGenerator[ChoiceChunk, None]:
            for index, request in enumerate(requests):
                async with aclosing(backend.complete(request)) as chunks:
                    async for chunk in chunks:
                        yield index, chunk

        def observe(piece: ChoiceChunk) -> None:
            timer(piece[1])

        on_close = self.observe.finished(lease.model_id, usage)
        return await open_stream(lease, each, observe=observe, on_close=on_close, usage=usage)

    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[EmbeddingResult]:
        slot = self.slot_for(name, Task.EMBEDDING, options)
        outcome = await self._timed(slot, EmbeddingBackend, options, len(request.inputs),
                                    lambda lease: embed_on(lease, slot.embedding_cache, request))  # fmt: skip
        slot.dimensions = int(outcome.value.vectors.shape[1])  # what /v1/models shows
        return outcome

    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[PairScores]:
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

    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Loglikelihood]]:
        """Score each (prompt, continuation) on one turn of the model, its scored tokens
        counted as each is done (the turn's prompt tokens)."""
        usage = RequestUsage()
        async with await self.lease(name, Task.SCORING, ScoringBackend, options) as lease:
            scored = []
            try:
                for i, (prompt, cont) in enumerate(pairs):
                    scored.append(await loglikelihood(lease.backend, prompt, cont, i))
                    lease.timing.prompt_tokens += scored[-1].scored_tokens  # before the turn's span ends with it
                    self.observe.count(lease.model_id, lease.timing, usage)
            except (ModelpoolError, asyncio.CancelledError) as exc:
                carry_usage(exc, usage)  # what it used before failing (or its caller leaving) goes back
                raise
            finally:
                self.observe.finished(lease.model_id, usage)(lease.timing)
            return Outcome(scored, lease.timing, usage)

    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Generation]]:
        """Generate for every prompt at once, on as many turns of the model (at most all):
        an engine that batches runs them together, one that does not runs them in turn. The
        first that fails (or the caller leaving) stops all the others before this returns."""
        name, adapter = split_adapter(self._names, name, requests[0].adapter if requests else None)
        requests = [replace(r, adapter=adapter) for r in requests]
        if any(r.output is not None for r in requests):
            _check_structured(self.slot_for(name, Task.COMPLETION, options), "json_schema")
        self._check_beams(name, requests, options)
        requests = self._defaulted(name, requests)
        usage = RequestUsage()
        async with await self.lease(name, Task.COMPLETION, CompletionBackend, options, size=len(requests)) as lease:

            async def one(request: CompletionRequest) -> Generation:
                async with aclosing(lease.backend.complete(request)) as chunks:
                    timer = self.observe.chunks(lease.model_id, lease.timing, usage)  # one per generation
                    return await collect(_observed(chunks, timer, lease))

            try:
                return Outcome(await all_or_none(requests, one), lease.timing, usage)
            except (ModelpoolError, asyncio.CancelledError) as exc:
                carry_usage(exc, usage)  # what the batch used before failing (or its caller leaving)
                raise
            finally:
                self.observe.finished(lease.model_id, usage)(lease.timing)

    def _check_beams(self, name: str, requests: list[CompletionRequest], options: CallOptions) -> None:
        if any(r.sampling.beam is not None for r in requests):
            slot = self.slot_for(name, Task.COMPLETION, options)
            for request in requests:
                check_beam(slot, request.sampling, output=request.output is not None)

    def _defaulted(self, name: str, requests: list[CompletionRequest]) -> list[CompletionRequest]:
        """The prompts with the model's sampling defaults where their client set nothing (and
        a beam search's length bounded)."""
        slot = self.slot(name)
        return [
            replace(r, sampling=beam_bounded(with_model_defaults(r.sampling, slot.config.sampling), slot))
            for r in requests
        ]

    async def tokenize(
        self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Tokenized]:
        """Token ids by the tokenizer of the model `name` names (None: the only model with one).
        A chat takes the model's `enable_thinking` default, as a real call does: on a
        thinking-aware template the count would differ from the call's otherwise."""
        async with await self._tokenizer_lease(name, options) as lease:
            if job.chat is not None:
                chat = with_thinking_default(job.chat, self.slot(lease.model_id).config.enable_thinking)
                job = replace(job, chat=chat)
            return Outcome(await tokenize_on(lease.model_id, lease.backend, job), lease.timing, RequestUsage())

    async def detokenize(
        self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Detokenized]:
        async with await self._tokenizer_lease(name, options) as lease:
            text = await lease.backend.decode_tokens(ids)
            return Outcome(Detokenized(lease.model_id, text), lease.timing, RequestUsage())

    async def _tokenizer_lease(self, name: str | None, options: CallOptions) -> Lease[TokenizerBackend]:
        slot = tokenizer_slot(self.slots(), None if name is None else self.slot(name))
        check_keep_alive(options, slot.config)
        return await slot.lease(TokenizerBackend, self.model_wait_s, options.keep_alive, schedule=options.schedule)


def _check_chat_features(slot: ModelSlot, request: ChatRequest) -> None:
    """Tools and response formats go only to models whose backend declares them: refused
    here, with the field named, rather than silently ignored."""
    if request.tools and request.tool_choice.mode != "none" and not slot.capabilities.declared.tools:
        raise InvalidRequest(f"model '{slot.id}' does not support tool calling", param="tools")
    if request.output is not None:
        _check_structured(slot, "response_format")
    check_beam(slot, request.sampling, tools=bool(request.tools) and request.tool_choice.mode != "none",
               output=request.output is not None)  # fmt: skip


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
