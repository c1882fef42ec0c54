"""POST /v1/chat/completions request body."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from modelpool.errors import InvalidRequest
from modelpool.inference import ChatMessage, ChatRequest, ContentPart
from modelpool.wire.common import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    GenerationFields,
    TemplateKwargs,
    Text,
    WireModel,
)
from modelpool.wire.openai.content import ChatPart, to_content
from modelpool.wire.sizes import charge_template_kwargs
from modelpool.wire.tools import (
    ChatTool,
    ChoiceMode,
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    check_tool_results,
    format_output,
    to_tool_calls,
    to_tool_choice,
    to_tools,
)


class Message(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[ChatPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Text | None = None
    tool_calls: list[MessageToolCall] | None = None
    """An assistant message's calls."""
    tool_call_id: str | None = None
    """A tool message's call."""


class ChatCompletionBody(GenerationFields):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = Field(default=None, discriminator="type")
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    tool_choice: ChoiceMode | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    """Extra variables for the model's chat template (vLLM's name), e.g. {"enable_thinking": false}."""

    @model_validator(mode="after")
    def _logprob_fields_agree(self) -> ChatCompletionBody:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self

    def to_request(self) -> ChatRequest:
        messages = tuple(_to_message(i, m) for i, m in enumerate(self.messages))
        if messages[-1].role == "assistant" and not messages[-1].content:
            raise InvalidRequest("the last message is an empty assistant message", param="messages")
        check_tool_results(messages)
        charge_template_kwargs(self.chat_template_kwargs or {}, "chat_template_kwargs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens or self.max_tokens
        sampling = self.sampling(max_tokens=max_tokens, logprobs=logprobs)
        tools = to_tools([t.function for t in self.tools or []], lambda i: f"tools[{i}].function")
        named = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None
        mode = None if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice
        output = format_output(self.response_format, "response_format.json_schema.schema")
        return ChatRequest(
            messages,
            sampling,
            self.chat_template_kwargs or {},
            streamed=self.stream,
            tools=tools,
            tool_choice=to_tool_choice(mode, named, tools, "tool_choice"),
            parallel_tool_calls=self.parallel_tool_calls is not False,
            output=output,
            adapter=self.adapter,
        )


def _to_message(index: int, message: Message) -> ChatMessage:
    role = "system" if message.role == "developer" else message.role
    parts: tuple[ContentPart, ...] = ()
    if isinstance(message.content, list):
        where = f"messages[{index}].content"
        content, parts = to_content(message.content, where, images_allowed=role == "user")
    else:
        content = message.content or ""
    if not content and not parts and role not in ("assistant", "tool"):
        raise InvalidRequest(f"a {message.role} message must have content", param=f"messages[{index}].content")
    if message.tool_calls and role != "assistant":
        raise InvalidRequest("only assistant messages carry tool_calls", param=f"messages[{index}].tool_calls")
    calls = to_tool_calls(message.tool_calls or [])
    return ChatMessage(role, content, message.name, tool_calls=calls, tool_call_id=message.tool_call_id, parts=parts)
