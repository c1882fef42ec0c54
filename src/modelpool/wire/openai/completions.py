"""POST /v1/completions (the legacy text completions API): the request body, and the
reply, whole or as its stream of `text_completion` events ending with `data: [DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from pydantic import Field, field_validator, model_validator

from modelpool.inference import CompletionRequest, GenerationChunk, Usage
from modelpool.pool_api.generation import Generation
from modelpool.wire.common import GenerationFields, Text, protocol_default
from modelpool.wire.openai.render import ResponseMeta, completion_logprobs_json, envelope, usage_json
from modelpool.wire.sse import DONE, sse

Prompt = Text | list[Text] | list[int] | list[list[int]]
MAX_PROMPTS = 64


class CompletionBody(GenerationFields):
    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = Field(default=None, json_schema_extra={"maxLength": 0})  # no fill-in-the-middle
    best_of: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 1})

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: Prompt) -> Prompt:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        if isinstance(value, list) and isinstance(value[0], list) and any(not ids for ids in value):
            raise ValueError("a token-id prompt must not be empty")
        if isinstance(value, list) and len(value) > MAX_PROMPTS and not isinstance(value[0], int):
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (fill-in-the-middle) is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return value

    @model_validator(mode="after")
    def _tokens_need_room(self) -> CompletionBody:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens=0 only makes sense with echo=true")
        return self

    def prompts(self) -> list[str | tuple[int, ...]]:
        """The prompt as a list of separate prompts (text or token ids)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [tuple(self.prompt)]
        return [p if isinstance(p, str) else tuple(p) for p in self.prompt]

    def to_requests(self) -> list[CompletionRequest]:
        sampling = self.sampling(max_tokens=self.max_tokens, logprobs=self.logprobs)
        if "max_tokens" not in self.model_fields_set:  # OpenAI's 16, unless a configured default says otherwise
            sampling = protocol_default(sampling, "max_tokens")
        return [CompletionRequest(prompt, sampling, self.echo, streamed=self.stream, adapter=self.adapter)
                for prompt in self.prompts()]  # fmt: skip


def completion_json(
    meta: ResponseMeta, generations: Sequence[Generation], logprobs: bool, **extra: Any
) -> dict[str, Any]:
    """The whole reply: one choice per prompt, their usage summed."""
    choices = [
        _choice(index, g.text, g.finish_reason, completion_logprobs_json(g.logprobs, 0) if logprobs else None)
        for index, g in enumerate(generations)
    ]
    usage = Usage(sum(g.usage.prompt_tokens for g in generations), sum(g.usage.completion_tokens for g in generations))
    return envelope(meta, "text_completion", choices, usage=usage_json(usage), **extra)


async def completion_chunks(
    chunks: AsyncIterator[tuple[int, GenerationChunk]],
    meta: ResponseMeta,
    logprobs: bool,
    include_usage: bool,
    end: Callable[[], Awaitable[dict[str, Any]]],
) -> AsyncIterator[bytes]:
    """The stream: each prompt's chunks under its choice index. `end` runs after the last
    chunk (it gives the model's turn back) and returns the last event's extra fields."""
    usage = Usage(0, 0)
    usage_field = {"usage": None} if include_usage else {}
    offsets: dict[int, int] = {}
    async for index, chunk in chunks:
        offset = offsets.get(index, 0)
        chunk_logprobs = completion_logprobs_json(chunk.logprobs, offset) if logprobs else None
        offsets[index] = offset + len(chunk.text)
        if chunk.text or chunk.finish_reason or chunk.logprobs:
            choice = _choice(index, chunk.text, chunk.finish_reason, chunk_logprobs)
            yield sse(envelope(meta, "text_completion", [choice], **usage_field))
        if chunk.usage:
            usage = Usage(usage.prompt_tokens + chunk.usage.prompt_tokens,
                          usage.completion_tokens + chunk.usage.completion_tokens)  # fmt: skip
    metrics = await end()
    if include_usage or metrics:
        usage_part = {"usage": usage_json(usage)} if include_usage else {}
        yield sse(envelope(meta, "text_completion", [], **usage_part, **metrics))
    yield DONE


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
