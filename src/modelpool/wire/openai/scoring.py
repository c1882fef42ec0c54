"""The scoring routes the evaluation harnesses want, /loglikelihood and /generate: their
bodies and their replies."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from modelpool.inference import CompletionRequest
from modelpool.pool_api.generation import Generation
from modelpool.pool_api.results import Loglikelihood
from modelpool.wire.common import GenerationFields, PoolFields, Text, protocol_default
from modelpool.wire.tools import to_output

MAX_ITEMS = 1024


class LoglikelihoodBody(PoolFields):
    model: str | None = Field(default=None, min_length=1)
    """None (the HRM contract's v1 bodies carry no `model`): the server's default scoring
    model, or the only one (`defaults.models`)."""
    prompts: list[Text] = Field(min_length=1, max_length=MAX_ITEMS)
    continuations: list[Text] = Field(min_length=1, max_length=MAX_ITEMS)

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
        return [CompletionRequest(p if isinstance(p, str) else tuple(p), sampling, output=output) for p in self.prompts]


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
