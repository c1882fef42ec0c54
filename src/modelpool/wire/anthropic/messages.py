"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) request
bodies, and their translation to the pool's ChatRequest: `system` becomes a system message,
`tools` function tools (`any` is OpenAI's `required`), `thinking` the chat template's
`enable_thinking` switch, `output_config.format` structured output. Fields Anthropic's
clients send that change nothing here (`cache_control`, `citations`, `metadata`,
`service_tier`, `speed`, ...) are accepted and ignored; others are refused, as Anthropic
refuses them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from modelpool.errors import InvalidRequest
from modelpool.inference import ChatRequest, OutputFormat, SamplingParams, Tool, ToolChoice
from modelpool.wire.anthropic.blocks import Ignored, MessageParam, TextBlock, to_chat_messages
from modelpool.wire.common import (
    MAX_MESSAGES,
    MAX_STOP_SEQUENCES,
    MAX_TOP_K,
    PoolFields,
    Text,
    WireModel,
    left_out,
)
from modelpool.wire.tools import (
    FUNCTION_NAME,
    ChoiceMode,
    FunctionDefinition,
    to_output,
    to_tool_choice,
    to_tools,
)


class ToolParam(WireModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: Text | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: Ignored = None
    strict: bool | None = None
    input_examples: list[dict[str, Any]] | None = None
    eager_input_streaming: bool | None = None


class AutoChoice(WireModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class AnyChoice(WireModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class NamedChoice(WireModel):
    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool | None = None


class NoneChoice(WireModel):
    type: Literal["none"]


ToolChoiceParam = Annotated[AutoChoice | AnyChoice | NamedChoice | NoneChoice, Field(discriminator="type")]


class ThinkingSwitch(WireModel):
    """`enabled` and `disabled` flip the model's thinking switch; `adaptive` and
    `between_tools` leave it to the model's default. `budget_tokens` is accepted but not a
    separate cap here: `max_tokens` bounds thinking and answer together."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)
    display: Literal["summarized", "omitted"] | None = None


class Metadata(WireModel):
    user_id: str | None = None


class JsonSchemaOutput(WireModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(WireModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    """Accepted; a local model has one effort."""
    format: JsonSchemaOutput | None = None
    """Structured output: the answer is JSON matching the schema (enforced by the pool)."""


class ConversationBody(PoolFields):
    """What count_tokens takes: the prompt, without sampling."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Text | list[TextBlock] | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingSwitch | None = None
    output_config: OutputConfig | None = None
    cache_control: Ignored = None
    speed: Literal["standard", "fast"] | None = None
    inference_geo: str | None = None

    def to_request(self, sampling: SamplingParams, *, streamed: bool) -> ChatRequest:
        system = self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system or [])
        definitions = [FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema)
                       for t in self.tools or []]  # fmt: skip
        tools = to_tools(definitions, lambda i: f"tools[{i}]")
        choice = self.tool_choice
        return ChatRequest(
            to_chat_messages(system, self.messages),
            sampling,
            self._template_kwargs(),
            streamed=streamed,
            tools=tools,
            tool_choice=_tool_choice(choice, tools),
            parallel_tool_calls=not _no_parallel(choice),
            output=self._output(),
        )

    def shows_thinking(self) -> bool:
        return self.thinking is None or self.thinking.display != "omitted"

    def _output(self) -> OutputFormat | None:
        chosen = self.output_config.format if self.output_config is not None else None
        return None if chosen is None else to_output("json_schema", chosen.schema_, "output_config.format.schema")

    def _template_kwargs(self) -> dict[str, Any]:
        if self.thinking is None or self.thinking.type not in ("enabled", "disabled"):
            return {}
        return {"enable_thinking": self.thinking.type == "enabled"}


class MessagesBody(ConversationBody):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[Text] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None
    diagnostics: Ignored = None

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, value: list[str] | None) -> list[str] | None:
        if any(stop == "" for stop in value or []):
            raise ValueError("stop sequences must not be empty")
        return value

    def sampling(self) -> SamplingParams:
        """The request's sampling; a field it leaves out (and those Anthropic has not) is
        marked `unset`: the pool fills it with the model's default."""
        chosen: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": None,
            "repetition_penalty": None,
        }
        stops = tuple(self.stop_sequences or ())
        given = {k: v for k, v in chosen.items() if v is not None}
        return SamplingParams(max_tokens=self.max_tokens, stop=stops, unset=left_out(chosen), **given)


def _no_parallel(choice: ToolChoiceParam | None) -> bool:
    """Whether the choice turns parallel tool use off (`none` has no such field)."""
    return choice is not None and not isinstance(choice, NoneChoice) and bool(choice.disable_parallel_tool_use)


_MODES: dict[str, ChoiceMode] = {"auto": "auto", "any": "required", "none": "none"}


def _tool_choice(choice: ToolChoiceParam | None, tools: tuple[Tool, ...]) -> ToolChoice:
    """Anthropic's choice → the pool's: `any` is OpenAI's `required`, `tool` a named function."""
    if isinstance(choice, NamedChoice):
        return to_tool_choice(None, choice.name, tools, "tool_choice.name")
    if choice is not None and choice.type != "none" and not tools:
        raise InvalidRequest(f"tool_choice '{choice.type}' needs tools", param="tool_choice")
    return to_tool_choice(_MODES[choice.type] if choice else None, None, tools, "tool_choice")
