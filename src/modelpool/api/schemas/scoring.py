"""Bodies of the scoring routes: /loglikelihood and /generate."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from modelpool.api.schemas.common import GenerationFields, PoolFields, Text
from modelpool.api.schemas.tools import to_output
from modelpool.config.schema import SamplingDefaults
from modelpool.inference import CompletionRequest

MAX_ITEMS = 1024


class LoglikelihoodBody(PoolFields):
    model: str = Field(min_length=1)
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

    def to_requests(self, defaults: SamplingDefaults) -> list[CompletionRequest]:
        sampling = self.sampling(defaults, max_tokens=self.max_tokens, logprobs=None)
        output = None if self.json_schema is None else to_output("json_schema", self.json_schema, "json_schema")
        return [CompletionRequest(p if isinstance(p, str) else tuple(p), sampling, output=output) for p in self.prompts]
