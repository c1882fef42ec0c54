"""POST /v1/completions (the legacy text completions API). All prompts of a request run
on one turn of the model, one after another (one stream, each chunk with its choice index)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.sse import EventStreamResponse
from modelpool.pool_api.generation import collect_choices
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, SSE, declared, sse_events
from modelpool.wire.openai.completions import CompletionBody, completion_chunks, completion_json
from modelpool.wire.openai.render import ResponseMeta

router = APIRouter(responses=declared(POOL_ERRORS, media={SSE: sse_events()}, rules=(  # JSON, or SSE with `stream`
    MODEL_LIMITS, "max_tokens 0 only with echo", "min_tokens at most max_tokens")))


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = body.to_requests()
    stream = await unless_disconnected(request, pool.complete(body.model, requests, body.call_options()))
    meta = ResponseMeta.new("cmpl", stream.model_id)
    want_logprobs = body.logprobs is not None
    if body.stream:

        async def end() -> dict[str, Any]:
            await stream.aclose()  # the turn goes back before the last event, so its timing is final
            return metrics_field(request, body.return_metrics, stream.timing)

        events = completion_chunks(stream, meta, want_logprobs, body.include_usage(), end)
        return EventStreamResponse(events, on_close=stream.aclose)
    async with stream:
        generations = await unless_disconnected(request, collect_choices(stream))
    extra = metrics_field(request, body.return_metrics, stream.timing)
    return JSONResponse(completion_json(meta, generations, want_logprobs, **extra))
