"""The scoring routes the evaluation harnesses want, /loglikelihood and /generate: their
bodies and their replies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from pydantic import Field, field_validator, model_validator

from modelpool.inference import CompletionRequest
from modelpool.pool_api.generation import ChoiceChunk, Generation
from modelpool.pool_api.results import Loglikelihood
from modelpool.wire.common import GenerationFields, PoolFields, Text, protocol_default
from modelpool.wire.sse import DONE, sse
from modelpool.wire.tools import to_output

MAX_ITEMS = 1024


class LoglikelihoodBody(PoolFields):
    model: str | None = Field(default=None, min_length=1)
    """None (the HRM contract's v1 bodies carry no `model`): the server's default scoring
    model, or the only one (`defaults.models`)."""
    prompts: list[Text] = Field(min_length=1, max_length=MAX_ITEMS)
    continuations: list[Text] = Field(min_length=1, max_length=MAX_ITEMS, json_schema_extra={"items": {"minLength": 1}})

    @model_validator(mode="after")
    def _same_length(self) -> LoglikelihoodBody:
        if len(self.prompts) != len(self.continuations):
            raise ValueError(
                f"prompts ({len(self.prompts)}) and continuations ({len(self.continuations)}) must be as many"
            )
        return self

    @field_validator("continuations")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not c for c in value):
            raise ValueError("a continuation must not be empty")
        return value


class GenerateBody(GenerationFields):
    model: str | None = Field(default=None, min_length=1)  # type: ignore[assignment]
    """None (the HRM contract's v1 bodies carry no `model`): the server's default completion
    model, or the only one (`defaults.models`)."""
    prompts: list[Text | list[int]] = Field(min_length=1, max_length=MAX_ITEMS)
    max_tokens: int = Field(default=16, ge=1)
    json_schema: dict[str, Any] | None = None
    """Every completion is JSON matching this schema (batch extraction); decoding is
    constrained, so each one parses unless cut by max_tokens."""

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("/generate does not stream; use /v1/completions with stream=true")
        return value

    def to_requests(self) -> list[CompletionRequest]:
        sampling = self.sampling(max_tokens=self.max_tokens, logprobs=None)
        if "max_tokens" not in self.model_fields_set:  # 16, unless a configured default says otherwise
            sampling = protocol_default(sampling, "max_tokens")
        output = None if self.json_schema is None else to_output("json_schema", self.json_schema, "json_schema")
        return [CompletionRequest(p if isinstance(p, str) else tuple(p), sampling, output=output, adapter=self.adapter)
                for p in self.prompts]  # fmt: skip


class GenerateStreamBody(GenerateBody):
    """`/generate_stream`: `/generate`'s body, its prompts' text streamed as it comes. The
    prompts run on one turn of the model, one after another (as a streamed
    `/v1/completions` runs them); structured output is `/generate`'s alone."""

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        return value  # this route always streams: the field says nothing more

    @field_validator("json_schema")
    @classmethod
    def _no_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise ValueError("/generate_stream does not take json_schema; use /generate")
        return value

    def to_requests(self) -> list[CompletionRequest]:
        return [replace(request, streamed=True) for request in super().to_requests()]


async def generate_stream_events(
    chunks: AsyncIterator[ChoiceChunk], model_id: str, end: Callable[[], Awaitable[None]]
) -> AsyncIterator[bytes]:
    """SSE: `{"index", "text", "finish_reason"}` for each piece of prompt `index`'s text
    (`finish_reason` null until its last), then `{"model", "usage"}`, then `[DONE]`. `end`
    runs after the last piece (the model's turn goes back before the usage is sent)."""
    prompt_tokens = completion_tokens = 0
    async for index, chunk in chunks:
        if chunk.text or chunk.finish_reason:
            yield sse({"index": index, "text": chunk.text, "finish_reason": chunk.finish_reason})
        if chunk.usage:
            prompt_tokens += chunk.usage.prompt_tokens
            completion_tokens += chunk.usage.completion_tokens
    await end()
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
    yield sse({"model": model_id, "usage": usage})
    yield DONE


def loglikelihood_json(model_id: str, results: list[Loglikelihood]) -> dict[str, Any]:
    scored = sum(r.scored_tokens for r in results)
    return {
        "model": model_id,
        "ll": [r.logprob for r in results],
        "is_greedy": [r.is_greedy for r in results],
        "usage": {"prompt_tokens": scored, "total_tokens": scored},
    }


def generate_json(model_id: str, results: list[Generation]) -> dict[str, Any]:
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    completion_tokens = sum(r.usage.completion_tokens for r in results)
    return {
        "model": model_id,
        "completions": [r.text for r in results],
        "finish_reasons": [r.finish_reason for r in results],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
