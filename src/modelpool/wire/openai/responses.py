"""POST /v1/responses request body: OpenAI's text subset, plus the fields people bring from
model-pool APIs (`messages`, `decoding`, `thinking`, language codes, and llm-pool's flat
content array as `input`: `[{"type": "text", ...}, {"type": "image_url", ...}]`, one user
message)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from modelpool.errors import InvalidRequest
from modelpool.inference import MAX_BEAM_SIZE, ChatMessage, ChatRequest, OutputFormat, SamplingParams, ToolCall
from modelpool.wire.beam import DETERMINISTIC, MAX_LENGTH_PENALTY, MIN_LENGTH_PENALTY, beam_search
from modelpool.wire.common import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_TOP_K,
    STOP_SCHEMA,
    PoolFields,
    StopSequences,
    Text,
    WireModel,
    check_min_tokens,
    checked_stop,
    first_given,
    left_out,
)
from modelpool.wire.openai.content import (
    AnyPart,
    ChatImagePart,
    ChatTextPart,
    ResponsesImagePart,
    ResponsesPart,
    ResponsesTextPart,
    to_content,
)
from modelpool.wire.tools import (
    FUNCTION_NAME,
    ChoiceMode,
    FunctionDefinition,
    JsonObjectFormat,
    to_output,
    to_tool_choice,
    to_tools,
)
from modelpool.wire.tools import TextFormat as TextOnly


class InputMessage(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[ResponsesPart], Field(max_length=MAX_CONTENT_PARTS)]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(WireModel):
    """A call the model made in an earlier turn, sent back as input."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: Text
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(WireModel):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Text
    id: str | None = None
    status: str | None = None


def _item_kind(item: Any) -> str:
    """A message item may leave out its `type` (OpenAI's "easy input message")."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return kind if isinstance(kind, str) else "message"


FLAT_PART_TYPES = frozenset({"text", "input_text", "image_url", "input_image"})
"""The `type`s of llm-pool's flat `input` parts (both APIs' spellings). None of them is an
input item type of OpenAI's, so a list of them cannot be mistaken for an item list."""


def _is_flat_part(item: Any) -> bool:
    # `type` may be anything a client sends (a list is unhashable): only a string names a part.
    kind = item.get("type") if isinstance(item, dict) and "role" not in item else None
    return isinstance(kind, str) and kind in FLAT_PART_TYPES


def check_not_mixed(items: list[Any]) -> None:
    """A list is either llm-pool's flat content array or OpenAI's item list, never both:
    a mixed one is refused naming its first element of the other kind."""
    flat = [_is_flat_part(item) for item in items[: MAX_MESSAGES + 1]]  # longer lists fail their cap anyway
    if any(flat) and not all(flat):
        index = flat.index(not flat[0])
        first, other = ("a content part", "an input item") if flat[0] else ("an input item", "a content part")
        raise ValueError(
            f"input[{index}] is {other} but input[0] is {first}: give either a flat content array "
            "(parts of one user message: text, input_text, image_url, input_image) or a list of input items"
        )


_PARTS = (ChatTextPart, ChatImagePart, ResponsesTextPart, ResponsesImagePart)

InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionTool(WireModel):
    """`{"type": "function", "name": ..., "parameters": ...}` (the Responses API's flat shape)."""

    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def definition(self) -> FunctionDefinition:
        return FunctionDefinition(name=self.name, description=self.description, parameters=self.parameters)


class NamedFunction(WireModel):
    type: Literal["function"]
    name: str = Field(min_length=1)


class JsonSchemaText(WireModel):
    type: Literal["json_schema"]
    name: str = Field(default="response", pattern=FUNCTION_NAME)
    schema_: dict[str, Any] = Field(alias="schema")
    description: Text | None = None
    strict: bool | None = None


class PoolMessage(WireModel):
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Annotated[list[AnyPart], Field(max_length=MAX_CONTENT_PARTS)]


class Decoding(WireModel):
    beam_size: int = Field(default=1, ge=1, le=MAX_BEAM_SIZE)
    """Above 1: the engine's own beam search (CTranslate2, transformers; see wire.beam)."""
    length_penalty: float | None = Field(default=None, ge=MIN_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY)
    """Beam search only: hypotheses compare by log-probability / length ** length_penalty (1)."""
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: StopSequences = Field(default=None, json_schema_extra=STOP_SCHEMA)
    ignore_eos: bool = False
    """As on chat completions: generate until max_tokens, past end-of-sequence."""
    min_tokens: int = Field(default=0, ge=0)
    """As on chat completions: no end-of-sequence or stop sequence before this many tokens."""

    @field_validator("stop")
    @classmethod
    def _sane_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        return checked_stop(value)


class TextFormat(WireModel):
    format: Annotated[TextOnly | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")] | None = None

    def output(self) -> OutputFormat | None:
        chosen = self.format
        if isinstance(chosen, JsonSchemaText):
            return to_output("json_schema", chosen.schema_, "text.format.schema", chosen.name)
        return to_output(chosen.type, None, "text.format") if chosen is not None else None


class ResponsesBody(PoolFields):
    model: str = Field(min_length=1)
    input: (
        Text
        | Annotated[list[InputItem], Field(max_length=MAX_MESSAGES)]
        | Annotated[list[AnyPart], Field(max_length=MAX_CONTENT_PARTS)]
        | None
    ) = None
    messages: list[PoolMessage] | None = Field(default=None, max_length=MAX_MESSAGES)
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
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: ChoiceMode | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextFormat | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _flat_or_items(cls, value: Any) -> Any:
        if isinstance(value, list):
            check_not_mixed(value)
        return value

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
        """This request's turn(s), without instructions or earlier responses. Calls sent back
        become an assistant message with `tool_calls` (consecutive ones together), their
        outputs `tool` messages."""
        if self.messages is not None:
            return [_message(m.role, m.content, f"messages[{i}].content") for i, m in enumerate(self.messages)]
        if isinstance(self.input, str):
            if not self.input:
                raise InvalidRequest("input must not be empty", param="input")
            return [ChatMessage("user", self.input)]
        if self.input and isinstance(self.input[0], _PARTS):  # llm-pool's flat content array: one user message
            return [_message("user", list(self.input), "input")]
        said: list[ChatMessage] = []
        for index, item in enumerate(self.input or []):
            if isinstance(item, _PARTS):
                continue  # not reached: a list is all parts or none (check_not_mixed)
            if isinstance(item, FunctionCallItem):
                call = ToolCall(item.call_id, item.name, item.arguments)
                last = said[-1] if said else None
                if last is not None and last.role == "assistant" and last.tool_calls:
                    said[-1] = replace(last, tool_calls=(*last.tool_calls, call))
                else:
                    said.append(ChatMessage("assistant", "", tool_calls=(call,)))
            elif isinstance(item, FunctionCallOutputItem):
                said.append(ChatMessage("tool", item.output, tool_call_id=item.call_id))
            else:
                said.append(_message(item.role, item.content, f"input[{index}].content"))
        return said

    def tool_fields(self) -> dict[str, Any]:
        """tools, tool_choice, parallel_tool_calls and output of the chat request."""
        tools = to_tools([t.definition() for t in self.tools or []], lambda i: f"tools[{i}]")
        named = self.tool_choice.name if isinstance(self.tool_choice, NamedFunction) else None
        mode = None if isinstance(self.tool_choice, NamedFunction) else self.tool_choice
        return {
            "tools": tools,
            "tool_choice": to_tool_choice(mode, named, tools, "tool_choice"),
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "output": self.text.output() if self.text is not None else None,
        }

    def sampling(self) -> SamplingParams:
        """The request's sampling; a field it leaves out is marked `unset`: the pool fills it
        with the model's default."""
        decoding = self.decoding or Decoding()
        stop = [decoding.stop] if isinstance(decoding.stop, str) else decoding.stop or []
        chosen: dict[str, Any] = {
            "temperature": first_given(decoding.temperature, self.temperature),
            "top_p": first_given(decoding.top_p, self.top_p),
            "top_k": decoding.top_k,
            "min_p": None,
            "repetition_penalty": decoding.repetition_penalty,
        }
        max_tokens = first_given(decoding.max_tokens, self.max_output_tokens)
        check_min_tokens(decoding.min_tokens, max_tokens, param="decoding.min_tokens")
        sampled = {"decoding.temperature": decoding.temperature, "decoding.top_p": decoding.top_p,
                   "decoding.top_k": decoding.top_k, "temperature": self.temperature, "top_p": self.top_p}  # fmt: skip
        greedy = chosen["temperature"] == 0 or decoding.top_k == 1
        beam = beam_search(decoding.beam_size, decoding.length_penalty, sampled, greedy=greedy, prefix="decoding.")
        if beam is not None:
            chosen.update(DETERMINISTIC)
        return SamplingParams(
            max_tokens=max_tokens,
            stop=tuple(stop),
            ignore_eos=decoding.ignore_eos,
            min_tokens=decoding.min_tokens,
            beam=beam,
            unset=left_out({**chosen, "max_tokens": max_tokens}),
            **{k: v for k, v in chosen.items() if v is not None},
        )

    def to_request(self, said: list[ChatMessage], sampling: SamplingParams, tool_fields: dict[str, Any]) -> ChatRequest:
        """The chat request: the instructions as a system message, then `said` (the earlier
        responses' conversation and this request's turns)."""
        system = [ChatMessage("system", self.instructions)] if self.instructions else []
        return ChatRequest(tuple(system + said), sampling, self.template_kwargs(), streamed=self.stream, **tool_fields)

    def template_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.thinking != "default":
            kwargs["enable_thinking"] = self.thinking == "enabled"
        if self.source_lang_code:
            kwargs["source_lang_code"] = self.source_lang_code
        if self.target_lang_code:
            kwargs["target_lang_code"] = self.target_lang_code
        return kwargs


def _message(role: str, content: str | list[Any], where: str) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage(_role(role), content)
    text, parts = to_content(content, where, images_allowed=role == "user", separator="")
    return ChatMessage(_role(role), text, parts=parts)


def _role(role: str) -> str:
    return "system" if role == "developer" else role
