"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import ResponseMeta, note_model, pool_of
from modelpool.api.render import chat_logprobs_json, envelope, usage_json
from modelpool.api.schemas.chat import ChatCompletionBody
from modelpool.api.sse import DONE, EventStreamResponse, sse
from modelpool.backends.base import Usage
from modelpool.runtime.generation import GenerationStream, collect

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    stream = await pool.chat(body.model, body.to_request(pool.slot(body.model).config.sampling))
    meta = ResponseMeta.new("chatcmpl", stream.model_id)
    if body.stream:
        return EventStreamResponse(_events(stream, meta, body.include_usage()), on_close=stream.aclose)
    try:
        generation = await collect(stream)
    finally:
        await stream.aclose()
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": generation.text},
        "logprobs": chat_logprobs_json(generation.logprobs) if body.logprobs else None,
        "finish_reason": generation.finish_reason,
    }
    return JSONResponse(envelope(meta, "chat.completion", [choice], usage_json(generation.usage)))


async def _events(stream: GenerationStream, meta: ResponseMeta, include_usage: bool) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    yield sse(envelope(meta, "chat.completion.chunk", [first], **usage_field))
    usage: Usage | None = None
    async for chunk in stream:
        if chunk.text or chunk.logprobs:
            choice = {
                "index": 0,
                "delta": {"content": chunk.text},
                "logprobs": chat_logprobs_json(chunk.logprobs) if chunk.logprobs else None,
                "finish_reason": None,
            }
            yield sse(envelope(meta, "chat.completion.chunk", [choice], **usage_field))
        if chunk.finish_reason:
            usage = chunk.usage
            last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": chunk.finish_reason}
            yield sse(envelope(meta, "chat.completion.chunk", [last], **usage_field))
    if include_usage and usage is not None:
        yield sse(envelope(meta, "chat.completion.chunk", [], usage_json(usage)))
    yield DONE
