"""POST /v1/completions request body."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from modelpool.api.schemas.common import GenerationFields, Text
from modelpool.config.schema import SamplingDefaults
from modelpool.inference import CompletionRequest

Prompt = Text | list[Text] | list[int] | list[list[int]]
MAX_PROMPTS = 64


class CompletionBody(GenerationFields):
    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

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

    def to_requests(self, defaults: SamplingDefaults) -> list[CompletionRequest]:
        sampling = self.sampling(defaults, max_tokens=self.max_tokens, logprobs=self.logprobs)
        return [CompletionRequest(prompt, sampling, self.echo, streamed=self.stream) for prompt in self.prompts()]
