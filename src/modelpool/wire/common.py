"""Fields shared by the generation endpoints, and their translation to SamplingParams."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from modelpool.config.durations import parse_duration
from modelpool.config.schema import ADAPTER_NAME_PATTERN
from modelpool.errors import InvalidRequest
from modelpool.inference import DEFAULTED, MAX_BEAM_SIZE, SamplingParams
from modelpool.owner import caller_is_admin
from modelpool.pool_api.call import CallOptions
from modelpool.wire.beam import DETERMINISTIC, MAX_LENGTH_PENALTY, MIN_LENGTH_PENALTY, beam_search
from modelpool.wire.numbers import as_integers, integer_fields

MAX_STOP_SEQUENCES = 16
MAX_TOP_K = 2**31 - 1
"""`top_k` past any vocabulary: what every engine takes as a C int (a bigger number would overflow there)."""
MAX_MESSAGES = 10_000
"""Most messages (input items, turns) one request may carry. pydantic checks a list's
length before its items, so a body of 300,000 tiny messages is refused in microseconds
instead of holding the event loop a second while each is validated."""
MAX_CONTENT_PARTS = 1_000
"""Most content parts (text, images, audio) one message may carry."""
MAX_KEEP_ALIVE_S = 366 * 86400.0
"""The longest finite `keep_alive` a request may ask (a year); -1 keeps the model for ever."""
SEED_RANGE = (-(2**63), 2**63 - 1)
"""OpenAI's `seed` is a 64-bit integer; engines overflow (a 500) past it."""
RESERVED_TEMPLATE_KWARGS = frozenset({
    # What the renderers set themselves (llama.cpp's Jinja, transformers' apply_chat_template
    # for tokenizers and processors): a request's variable of the same name would replace
    # the conversation or the template, change how it renders, or clash (TypeError: a 500).
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    "load_audio_from_video", "sanitize_control_tokens", "bos_token", "eos_token", "unk_token", "pad_token",
    "sep_token", "cls_token", "mask_token", "additional_special_tokens", "raise_exception", "strftime_now",
})  # fmt: skip


class WireModel(BaseModel):
    # strict: "true" is not a bool and [true, false] is not a list of token ids.
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        """JSON does not tell 2 from 2.0, nor does JSON Schema (the published OpenAPI's
        `integer` admits both): an integer field takes a whole float as that integer, where
        strict validation alone would refuse it."""
        if not isinstance(data, dict):
            return data
        fields = integer_fields(cls)
        if fields.isdisjoint(data):
            return data
        return {key: as_integers(value) if key in fields else value for key, value in data.items()}


def _utf8_encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it holds a lone surrogate such as \\ud800)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8_encodable)]
"""A string that engines can encode: JSON allows lone surrogates, UTF-8 does not."""

StopSequences = Text | Annotated[list[Text], Field(max_length=MAX_STOP_SEQUENCES)] | None
"""`stop`: one sequence or a list of at most MAX_STOP_SEQUENCES, whose length pydantic
checks before its items (a body of millions of them would hold the event loop while each
is validated, and the engine would scan them all at every token); none empty: `checked_stop`."""
STOP_SCHEMA: JsonDict = {"minLength": 1, "maxItems": MAX_STOP_SEQUENCES, "items": {"minLength": 1}}


def checked_stop(value: str | list[str] | None) -> str | list[str] | None:
    """A field validator's check of `StopSequences`: an empty sequence would stop at once."""
    stops = [value] if isinstance(value, str) else value or []
    if any(s == "" for s in stops):
        raise ValueError("stop sequences must not be empty")
    return value


def _request_duration(value: Any) -> float:
    """A duration as the config reads one, but finite and at most a year: `inf`, `nan`,
    `1e999` or an integer too large for a float mean nothing a server can keep to."""
    try:
        seconds = parse_duration(value)
    except OverflowError:
        raise ValueError("keep_alive is too large (-1 keeps the model loaded)") from None
    if not math.isfinite(seconds) or seconds > MAX_KEEP_ALIVE_S:
        raise ValueError(f"keep_alive must be at most {MAX_KEEP_ALIVE_S:g} seconds, or -1 to keep the model loaded")
    return seconds


RequestDuration = Annotated[float, BeforeValidator(_request_duration),
                            WithJsonSchema({"type": "number", "maximum": MAX_KEEP_ALIVE_S})]  # fmt: skip
"""Seconds, or text like '5m' (the schema states the number; the text is a convenience)."""


def _no_reserved_keys(kwargs: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ValueError(f"may not set {', '.join(reserved)}: the server renders the chat template with its own "
                         "(send messages, tools and the like as the request's fields)")  # fmt: skip
    return kwargs


TemplateKwargs = Annotated[dict[str, Any], AfterValidator(_no_reserved_keys)]
"""`chat_template_kwargs`: the template's own extra variables, never the renderer's."""


class PoolFields(WireModel):
    """modelpool's own request fields (send them with the SDK's `extra_body`)."""

    keep_alive: RequestDuration | None = None
    """Keep the model loaded this long after this request (seconds or '5m'; 0 unloads
    right after, -1 keeps it), as in Ollama. Shorter than the model's configured
    keep_alive only with a key of the admin scope (403 else)."""
    return_metrics: bool = False
    """Add a `metrics` object (queue/load wait, backend time, time to first token, tokens/s)."""
    allow_remote: bool = False
    """Accept that a remote upstream (an `openai_remote` model) serves this request."""

    def call_options(self) -> CallOptions:
        return CallOptions(keep_alive=self.keep_alive, allow_remote=self.allow_remote,
                           may_shorten_keep_alive=caller_is_admin())  # fmt: skip


class StreamOptions(WireModel):
    include_usage: bool = False


class GenerationFields(PoolFields):
    """Sampling fields common to chat and text completions (OpenAI's, plus llama.cpp-style extras)."""

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: StopSequences = Field(default=None, json_schema_extra=STOP_SCHEMA)
    n: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 1})
    logit_bias: dict[str, float] | None = Field(default=None, json_schema_extra={"maxProperties": 0})
    user: str | None = None
    ignore_eos: bool = False
    """Keep generating past end-of-sequence until max_tokens (vLLM's extension)."""
    min_tokens: int = Field(default=0, ge=0)
    """Neither end-of-sequence nor a stop sequence ends the answer before this many tokens (vLLM's)."""
    beam_size: int | None = Field(default=None, ge=1, le=MAX_BEAM_SIZE)
    """Beam search with this many beams (modelpool's extension, llm-pool's `decoding.beam_size`):
    on CTranslate2 and transformers models (`capabilities.beam_search`), greedy, one answer."""
    length_penalty: float | None = Field(default=None, ge=MIN_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)
    """Beam search only: hypotheses compare by log-probability / length ** length_penalty (1)."""
    adapter: str | None = Field(default=None, pattern=ADAPTER_NAME_PATTERN)
    """The model's LoRA adapter to run with, by name (modelpool's extension; `model: "base:adapter"`
    says the same). A name from the model's `adapters:` only, never a path."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported; send several requests for several choices")
        return value

    @field_validator("stop")
    @classmethod
    def _sane_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        return checked_stop(value)

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self, *, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """The request's sampling; a field it leaves out is marked `unset`: the pool fills it
        with the model's default, else OpenAI's."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        given: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }
        check_min_tokens(self.min_tokens, max_tokens, param="min_tokens")
        greedy = self.temperature == 0 or self.top_k == 1
        beam = beam_search(self.beam_size, self.length_penalty, given, greedy=greedy)
        if beam is not None:
            given.update(DETERMINISTIC)
        return SamplingParams(
            max_tokens=max_tokens,
            seed=self.seed,
            beam=beam,
            stop=tuple(stops),
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            unset=left_out({**given, "max_tokens": max_tokens}),
            **{k: v for k, v in given.items() if v is not None},
        )


def left_out(fields: dict[str, Any]) -> frozenset[str]:
    """The sampling fields a request left out (None) that a model's config may give defaults
    for: the pool fills them as it receives the request (`SamplingParams.unset`)."""
    return frozenset(name for name, value in fields.items() if value is None and name in DEFAULTED)


def protocol_default(sampling: SamplingParams, name: str) -> SamplingParams:
    """`sampling` whose field `name` holds the protocol's own default (OpenAI's 16 tokens for
    a completion), not a value its client sent: a model's or the server's configured default
    still replaces it (`SamplingParams.unset`); without one, the protocol's stays."""
    return replace(sampling, unset=sampling.unset | {name})


def check_min_tokens(min_tokens: int, max_tokens: int | None, *, param: str) -> None:
    """A floor above the cap cannot be met: say so rather than quietly stop at the cap.
    Checked here against the request's own cap; the pool checks it against the model's
    default cap when it fills that in."""
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", param=param)


def first_given(*values: Any) -> Any:
    """The first value that is not None (a request's field, then the model's default, ...)."""
    return next((v for v in values if v is not None), None)
