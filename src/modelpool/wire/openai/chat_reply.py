"""A chat completion as OpenAI's API returns it: the whole `chat.completion`, or its
stream of `chat.completion.chunk` events ending with `data: [DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from modelpool.inference import GenerationChunk, Usage
from modelpool.pool_api.generation import Generation
from modelpool.wire.openai.render import ResponseMeta, chat_logprobs_json, envelope, usage_json
from modelpool.wire.sse import DONE, sse
from modelpool.wire.tools import tool_call_delta_json, tool_call_json

StreamEnd = Callable[[], Awaitable[dict[str, Any]]]
"""Run after the last chunk, before the closing events: gives the model's turn back (so its
timing is final) and returns the fields the last event adds (`metrics`)."""


def chat_completion_json(meta: ResponseMeta, generation: Generation, logprobs: bool, **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": generation.text, **_reasoning(generation.reasoning)}
    if generation.tool_calls:
        message["content"] = generation.text or None  # OpenAI's shape for a reply that only calls
        message["tool_calls"] = [tool_call_json(call) for call in generation.tool_calls]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs_json(generation.logprobs) if logprobs else None,
        "finish_reason": generation.finish_reason,
    }
    return envelope(meta, "chat.completion", [choice], usage=usage_json(generation.usage), **extra)


async def chat_chunks(
    chunks: AsyncIterator[GenerationChunk], meta: ResponseMeta, include_usage: bool, end: StreamEnd
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}

    def event(choice: dict[str, Any]) -> bytes:
        return sse(envelope(meta, "chat.completion.chunk", [choice], **usage_field))

    yield event({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None})
    usage: Usage | None = None
    finish: dict[str, object] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    async for chunk in chunks:
        for choice in _choices(chunk):
            yield event(choice)
        if chunk.finish_reason:
            usage = chunk.usage
            finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": chunk.finish_reason}
    metrics = await end()
    if include_usage and usage is not None:
        yield event(finish)
        yield sse(envelope(meta, "chat.completion.chunk", [], usage=usage_json(usage), **metrics))
    else:
        yield sse(envelope(meta, "chat.completion.chunk", [finish], **usage_field, **metrics))
    yield DONE


def _choices(chunk: GenerationChunk) -> list[dict[str, Any]]:
    """One chunk's events: its reasoning, its text (with logprobs), its tool-call pieces."""
    choices: list[dict[str, Any]] = []
    if chunk.reasoning:
        delta: dict[str, Any] = {"reasoning_content": chunk.reasoning}
        choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})
    if chunk.text or chunk.logprobs:
        logprobs = chat_logprobs_json(chunk.logprobs) if chunk.logprobs else None
        choices.append({"index": 0, "delta": {"content": chunk.text}, "logprobs": logprobs, "finish_reason": None})
    if chunk.tool_calls:
        delta = {"tool_calls": [tool_call_delta_json(piece) for piece in chunk.tool_calls]}
        choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})
    return choices


def _reasoning(text: str) -> dict[str, str]:
    """`reasoning_content`, as vLLM and DeepSeek name it, when the model reasoned."""
    return {"reasoning_content": text} if text else {}
