"""POST /v1/completions (the legacy text completions API). All prompts of a request run
on one turn of the model, one after another (one stream, each chunk with its choice index)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import ResponseMeta, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.render import completion_logprobs_json, envelope, usage_json
from modelpool.api.schemas.completions import CompletionBody
from modelpool.api.sse import DONE, EventStreamResponse, sse
from modelpool.inference import Usage
from modelpool.runtime.generation import ChoiceChunk, collect_choices
from modelpool.runtime.lease import ResultStream

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = body.to_requests(pool.sampling_defaults(body.model))
    stream = await unless_disconnected(request, pool.complete(body.model, requests, body.call_options()))
    meta = ResponseMeta.new("cmpl", stream.model_id)
    want_logprobs = body.logprobs is not None
    if body.stream:
        metrics_of = lambda: metrics_field(request, body.return_metrics, stream.timing)  # noqa: E731
        events = _events(stream, meta, want_logprobs, body.include_usage(), metrics_of)
        return EventStreamResponse(events, on_close=stream.aclose)
    async with stream:
        generations = await unless_disconnected(request, collect_choices(stream))
    choices = [
        _choice(index, g.text, g.finish_reason, completion_logprobs_json(g.logprobs, 0) if want_logprobs else None)
        for index, g in enumerate(generations)
    ]
    usage = Usage(sum(g.usage.prompt_tokens for g in generations), sum(g.usage.completion_tokens for g in generations))
    extra = metrics_field(request, body.return_metrics, stream.timing)
    return JSONResponse(envelope(meta, "text_completion", choices, usage=usage_json(usage), **extra))


async def _events(
    stream: ResultStream[ChoiceChunk],
    meta: ResponseMeta,
    want_logprobs: bool,
    include_usage: bool,
    metrics_of: Callable[[], dict[str, Any]],
) -> AsyncIterator[bytes]:
    usage = Usage(0, 0)
    usage_field = {"usage": None} if include_usage else {}
    offsets: dict[int, int] = {}
    async for index, chunk in stream:
        offset = offsets.get(index, 0)
        logprobs = completion_logprobs_json(chunk.logprobs, offset) if want_logprobs else None
        offsets[index] = offset + len(chunk.text)
        if chunk.text or chunk.finish_reason or chunk.logprobs:
            choice = _choice(index, chunk.text, chunk.finish_reason, logprobs)
            yield sse(envelope(meta, "text_completion", [choice], **usage_field))
        if chunk.usage:
            usage = Usage(usage.prompt_tokens + chunk.usage.prompt_tokens,
                          usage.completion_tokens + chunk.usage.completion_tokens)  # fmt: skip
    await stream.aclose()  # the turn goes back before the last event, so its timing is final
    metrics = metrics_of()
    if include_usage or metrics:
        usage_part = {"usage": usage_json(usage)} if include_usage else {}
        yield sse(envelope(meta, "text_completion", [], **usage_part, **metrics))
    yield DONE


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
