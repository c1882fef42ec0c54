"""POST /v1/completions (the legacy text completions API). All prompts of a request run
on one turn of the model, one after another."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import ResponseMeta, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.render import completion_logprobs_json, envelope, usage_json
from modelpool.api.schemas.completions import CompletionBody
from modelpool.api.sse import DONE, EventStreamResponse, sse
from modelpool.backends.base import CompletionRequest, Usage
from modelpool.runtime.generation import GenerationStream, collect
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.replica import Lease
from modelpool.tasks import Task

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = body.to_requests(pool.slot(body.model).config.sampling)
    lease = await unless_disconnected(request, pool.lease(body.model, Task.COMPLETION, body.call_options()))
    try:
        # The first prompt starts before answering, so a bad request still gets a 4xx.
        first = await pool.complete_on(lease, requests[0])
    except BaseException:
        lease.release()
        raise
    meta = ResponseMeta.new("cmpl", lease.model_id)
    opened = _each_stream(pool, lease, first, requests[1:])
    if body.stream:
        metrics_of = lambda: metrics_field(request, body.return_metrics, lease.timing)  # noqa: E731
        events = _events(opened, lease, meta, body.logprobs is not None, body.include_usage(), metrics_of)
        return EventStreamResponse(events, on_close=_closer(first, lease))
    try:
        choices, usage = await unless_disconnected(request, _collect_all(opened, lease, body.logprobs is not None))
    finally:
        await first.aclose()
        lease.release()
    extra = metrics_field(request, body.return_metrics, lease.timing)
    return JSONResponse(envelope(meta, "text_completion", choices, usage=usage_json(usage), **extra))


async def _collect_all(
    opened: AsyncIterator[GenerationStream], lease: Lease, want_logprobs: bool
) -> tuple[list[dict[str, Any]], Usage]:
    choices, usage = [], Usage(0, 0)
    index = 0
    async for stream in opened:
        try:
            generation = await collect(stream)
        finally:
            await stream.aclose()
        logprobs = completion_logprobs_json(generation.logprobs, 0) if want_logprobs else None
        choices.append(_choice(index, generation.text, generation.finish_reason, logprobs))
        usage = _add(usage, generation.usage)
        lease.timing.absorb(stream.timing)
        index += 1
    return choices, usage


async def _events(
    opened: AsyncIterator[GenerationStream],
    lease: Lease,
    meta: ResponseMeta,
    want_logprobs: bool,
    include_usage: bool,
    metrics_of: Callable[[], dict[str, Any]],
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
        lease.timing.absorb(stream.timing)
        index += 1
    lease.release()  # before the last event, so the timing in it is final
    metrics = metrics_of()
    if include_usage or metrics:
        usage_part = {"usage": usage_json(usage)} if include_usage else {}
        yield sse(envelope(meta, "text_completion", [], **usage_part, **metrics))
    yield DONE


async def _each_stream(
    pool: ModelPool, lease: Lease, first: GenerationStream, rest: list[CompletionRequest]
) -> AsyncIterator[GenerationStream]:
    """Each prompt's stream in turn, on the same lease; later ones start when reached."""
    yield first
    for request in rest:
        yield await pool.complete_on(lease, request)


def _closer(first: GenerationStream, lease: Lease) -> Any:
    async def close() -> None:
        await first.aclose()
        lease.release()

    return close


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens)
