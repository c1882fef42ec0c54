"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.api.sse import EventStreamResponse
from modelpool.pool_api.generation import collect
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, SSE, declared, sse_events
from modelpool.wire.openai.chat import ChatCompletionBody
from modelpool.wire.openai.chat_reply import chat_chunks, chat_completion_json
from modelpool.wire.openai.render import ResponseMeta
from modelpool.wire.sizes import translated

router = APIRouter(responses=declared(POOL_ERRORS, media={SSE: sse_events()}, rules=(  # JSON, or SSE with `stream`
    MODEL_LIMITS, "a tool message needs the tool_call_id it answers, and answers a call made before it",
    "min_tokens at most max_tokens")))


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    chat_request = await translated(limits_of(request), body.to_request)
    stream = await unless_disconnected(request, pool.chat(body.model, chat_request, body.call_options()))
    meta = ResponseMeta.new("chatcmpl", stream.model_id)
    if body.stream:

        async def end() -> dict[str, Any]:
            await stream.aclose()  # the turn goes back before the last event, so its timing is final
            return metrics_field(request, body.return_metrics, stream.timing)

        return EventStreamResponse(chat_chunks(stream, meta, body.include_usage(), end), on_close=stream.aclose)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    extra = metrics_field(request, body.return_metrics, stream.timing)
    return JSONResponse(chat_completion_json(meta, generation, bool(body.logprobs), **extra))
