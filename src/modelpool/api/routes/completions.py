"""POST /v1/completions (the legacy text completions API)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import ResponseMeta, note_model, pool_of, unless_disconnected, wants_metrics
from modelpool.api.render import completion_logprobs_json, envelope, usage_json
from modelpool.api.schemas.completions import CompletionBody
from modelpool.api.sse import DONE, EventStreamResponse, sse
from modelpool.backends.base import CompletionRequest, Usage
from modelpool.runtime.generation import GenerationStream, collect
from modelpool.runtime.pool import ModelPool

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = body.to_requests(pool.slot(body.model).config.sampling)
    # The first prompt is opened before answering, so a bad request still gets a 4xx.
    first = await unless_disconnected(request, pool.complete(body.model, requests[0], body.keep_alive))
    meta = ResponseMeta.new("cmpl", first.model_id)
    want_logprobs = body.logprobs is not None
    opened = _each_stream(pool, body, first, requests[1:])
    if body.stream:
        events = _events(
            opened, first, meta, want_logprobs, body.include_usage(), wants_metrics(request, body.return_metrics)
        )
        return EventStreamResponse(events, on_close=first.aclose)
    choices, usage = [], Usage(0, 0)
    index = 0
    async for stream in opened:
        try:
            generation = await unless_disconnected(request, collect(stream))
        finally:
            await stream.aclose()
        choices.append(
            _choice(
                index,
                generation.text,
                generation.finish_reason,
                completion_logprobs_json(generation.logprobs, 0) if want_logprobs else None,
            )
        )
        usage = _add(usage, generation.usage)
        if index:
            first.timing.absorb(stream.timing)
        index += 1
    extra = {"metrics": first.timing.as_json()} if wants_metrics(request, body.return_metrics) else {}
    return JSONResponse(envelope(meta, "text_completion", choices, usage_json(usage), **extra))


async def _events(
    opened: AsyncIterator[GenerationStream],
    first: GenerationStream,
    meta: ResponseMeta,
    want_logprobs: bool,
    include_usage: bool,
    with_metrics: bool,
) -> AsyncIterator[bytes]:
    usage = Usage(0, 0)
    usage_field = {"usage": None} if include_usage else {}
    index = 0
    async for stream in opened:
        try:
            offset = 0
            async for chunk in stream:
                logprobs = completion_logprobs_json(chunk.logprobs, offset) if want_logprobs else None
                offset += len(chunk.text)
                if chunk.text or chunk.finish_reason or chunk.logprobs:
                    choice = _choice(index, chunk.text, chunk.finish_reason, logprobs)
                    yield sse(envelope(meta, "text_completion", [choice], **usage_field))
                usage = _add(usage, chunk.usage) if chunk.usage else usage
        finally:
            await stream.aclose()
        if index:
            first.timing.absorb(stream.timing)
        index += 1
    metrics = {"metrics": first.timing.as_json()} if with_metrics else {}
    if include_usage or metrics:
        yield sse(envelope(meta, "text_completion", [], usage_json(usage) if include_usage else None, **metrics))
    yield DONE


async def _each_stream(
    pool: ModelPool, body: CompletionBody, first: GenerationStream, rest: list[CompletionRequest]
) -> AsyncIterator[GenerationStream]:
    """Each prompt's stream in turn; later prompts are opened only when they are reached."""
    yield first
    for request in rest:
        yield await pool.complete(body.model, request, body.keep_alive)


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens)
