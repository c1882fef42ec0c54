"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelpool.api.deps import ResponseMeta, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.render import chat_logprobs_json, envelope, usage_json
from modelpool.api.schemas.chat import ChatCompletionBody
from modelpool.api.schemas.sizes import limits_of, translated
from modelpool.api.schemas.tools import tool_call_delta_json, tool_call_json
from modelpool.api.sse import DONE, EventStreamResponse, sse
from modelpool.inference import GenerationChunk, Usage
from modelpool.runtime.generation import collect
from modelpool.runtime.lease import ResultStream

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    chat_request = await translated(limits_of(request), body.to_request, pool.sampling_defaults(body.model))
    stream = await unless_disconnected(request, pool.chat(body.model, chat_request, body.call_options()))
    meta = ResponseMeta.new("chatcmpl", stream.model_id)
    if body.stream:
        events = _events(
            stream, meta, body.include_usage(), lambda: metrics_field(request, body.return_metrics, stream.timing)
        )
        return EventStreamResponse(events, on_close=stream.aclose)
    async with stream:
        generation = await unless_disconnected(request, collect(stream))
    extra = metrics_field(request, body.return_metrics, stream.timing)
    message: dict[str, Any] = {"role": "assistant", "content": generation.text, **_reasoning(generation.reasoning)}
    if generation.tool_calls:
        message["content"] = generation.text or None  # OpenAI's shape for a reply that only calls
        message["tool_calls"] = [tool_call_json(call) for call in generation.tool_calls]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs_json(generation.logprobs) if body.logprobs else None,
        "finish_reason": generation.finish_reason,
    }
    return JSONResponse(envelope(meta, "chat.completion", [choice], usage=usage_json(generation.usage), **extra))


async def _events(
    stream: ResultStream[GenerationChunk],
    meta: ResponseMeta,
    include_usage: bool,
    metrics_of: Callable[[], dict[str, Any]],
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    yield sse(envelope(meta, "chat.completion.chunk", [first], **usage_field))
    usage: Usage | None = None
    finish: dict[str, object] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    async for chunk in stream:
        if chunk.reasoning:
            delta = {
                "index": 0,
                "delta": {"reasoning_content": chunk.reasoning},
                "logprobs": None,
                "finish_reason": None,
            }
            yield sse(envelope(meta, "chat.completion.chunk", [delta], **usage_field))
        if chunk.text or chunk.logprobs:
            choice = {
                "index": 0,
                "delta": {"content": chunk.text},
                "logprobs": chat_logprobs_json(chunk.logprobs) if chunk.logprobs else None,
                "finish_reason": None,
            }
            yield sse(envelope(meta, "chat.completion.chunk", [choice], **usage_field))
        if chunk.tool_calls:
            delta = {"tool_calls": [tool_call_delta_json(piece) for piece in chunk.tool_calls]}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            yield sse(envelope(meta, "chat.completion.chunk", [choice], **usage_field))
        if chunk.finish_reason:
            usage = chunk.usage
            finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": chunk.finish_reason}
    await stream.aclose()  # the turn goes back before the last event, so its timing is final
    metrics = metrics_of()
    if include_usage and usage is not None:
        yield sse(envelope(meta, "chat.completion.chunk", [finish], **usage_field))
        yield sse(envelope(meta, "chat.completion.chunk", [], usage=usage_json(usage), **metrics))
    else:
        yield sse(envelope(meta, "chat.completion.chunk", [finish], **usage_field, **metrics))
    yield DONE


def _reasoning(text: str) -> dict[str, str]:
    """`reasoning_content`, as vLLM and DeepSeek name it, when the model reasoned."""
    return {"reasoning_content": text} if text else {}
