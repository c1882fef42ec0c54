"""POST /v1/responses request body: OpenAI's text subset, plus the fields people bring from
model-pool APIs (`messages`, `decoding`, `thinking`, language codes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from modelpool.api.schemas.common import PoolFields, Text, WireModel, check_min_tokens, first_given
from modelpool.config.schema import SamplingDefaults
from modelpool.errors import InvalidRequest
from modelpool.inference import ChatMessage, SamplingParams


class TextPart(WireModel):
    type: Literal["input_text", "output_text", "text"]
    text: Text
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputMessage(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class PoolMessage(WireModel):
    role: Literal["user", "assistant", "system", "developer"]
    content: Text


class Decoding(WireModel):
    beam_size: int = Field(default=1, ge=1)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: Text | list[Text] | None = None
    ignore_eos: bool = False
    """As on chat completions: generate until max_tokens, past end-of-sequence."""
    min_tokens: int = Field(default=0, ge=0)
    """As on chat completions: no end-of-sequence or stop sequence before this many tokens."""

    @field_validator("beam_size")
    @classmethod
    def _no_beams(cls, value: int) -> int:
        if value != 1:
            raise ValueError("beam search is not supported; use beam_size 1 (sampling or greedy)")
        return value


class TextFormat(WireModel):
    format: dict[str, Any] | None = None

    @field_validator("format")
    @classmethod
    def _plain_text(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError("only the plain text format is supported")
        return value


class ResponsesBody(PoolFields):
    model: str = Field(min_length=1)
    input: Text | list[InputMessage] | None = None
    messages: list[PoolMessage] | None = None
    instructions: Text | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    decoding: Decoding | None = None
    thinking: Literal["default", "enabled", "disabled"] = "default"
    source_lang_code: str | None = None
    target_lang_code: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=0)
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None
    text: TextFormat | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> ResponsesBody:
        if (self.input is None) == (self.messages is None):
            raise ValueError("give exactly one of input or messages")
        if self.messages is not None and (not self.messages or self.messages[-1].role != "user"):
            raise ValueError("messages must end with a user message")
        if isinstance(self.input, list) and not self.input:
            raise ValueError("input must not be empty")
        return self

    def new_messages(self) -> list[ChatMessage]:
        """This request's turn(s), without instructions or earlier responses."""
        if self.messages is not None:
            return [ChatMessage(_role(m.role), m.content) for m in self.messages]
        if isinstance(self.input, str):
            if not self.input:
                raise InvalidRequest("input must not be empty", param="input")
            return [ChatMessage("user", self.input)]
        return [ChatMessage(_role(m.role), m.text()) for m in self.input or []]

    def sampling(self, defaults: SamplingDefaults) -> SamplingParams:
        decoding = self.decoding or Decoding()
        stop = [decoding.stop] if isinstance(decoding.stop, str) else decoding.stop or []
        chosen: dict[str, Any] = {
            "temperature": first_given(decoding.temperature, self.temperature, defaults.temperature),
            "top_p": first_given(decoding.top_p, self.top_p, defaults.top_p),
            "top_k": first_given(decoding.top_k, defaults.top_k),
            "min_p": defaults.min_p,
            "repetition_penalty": first_given(decoding.repetition_penalty, defaults.repetition_penalty),
        }
        max_tokens = first_given(decoding.max_tokens, self.max_output_tokens, defaults.max_tokens)
        check_min_tokens(decoding.min_tokens, max_tokens, param="decoding.min_tokens")
        return SamplingParams(
            max_tokens=max_tokens,
            stop=tuple(stop),
            ignore_eos=decoding.ignore_eos,
            min_tokens=decoding.min_tokens,
            **{k: v for k, v in chosen.items() if v is not None},
        )

    def template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.thinking != "default":
            kwargs["enable_thinking"] = self.thinking == "enabled"
        if self.source_lang_code:
            kwargs["source_lang_code"] = self.source_lang_code
        if self.target_lang_code:
            kwargs["target_lang_code"] = self.target_lang_code
        return kwargs


def _role(role: str) -> str:
    return "system" if role == "developer" else role
