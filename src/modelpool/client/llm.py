"""Chat and completion clients (LLM and VLM roles).

The preset decides the engine-specific parts of the request — the model name, whether
and how `enable_thinking` is sent, whether usage is asked for in streams — and where the
reasoning text is read from in the answer, so the same call works on every server.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar, TypedDict, overload

from typing_extensions import Unpack

from modelpool.client.base import RoleClient
from modelpool.client.config import Endpoint
from modelpool.client.errors import ConfigError
from modelpool.client.messages import MessageLike, messages_to_wire
from modelpool.client.presets import Role, Thinking
from modelpool.client.results import (
    ChatDelta,
    ChatResult,
    Completion,
    M,
    ParsedChat,
    chat_delta,
    chat_result,
    completion,
    parsed_chat,
    whole_call_deltas,
)
from modelpool.client.tools import (
    ResponseFormat,
    ToolChoice,
    ToolLike,
    response_format_value,
    tool_choice_value,
    tool_schema,
)
from modelpool.client.transport import sse_events

Stop = str | Sequence[str] | None
CHAT_PATH = "/v1/chat/completions"


class CompletionOptions(TypedDict, total=False):
    """The sampling options of `complete` (None, like leaving one out, sends nothing)."""

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stop: Stop
    seed: int | None
    extra_body: Mapping[str, Any] | None
    """Fields added to the body last (over the endpoint's extra_body and the call's own)."""


class ChatOptions(CompletionOptions, total=False):
    """The options of `chat` and `stream_chat` (and of the sync facade's)."""

    enable_thinking: bool | None
    tools: Sequence[ToolLike] | None
    """Functions the model may call: OpenAI tool dicts, functions, pydantic model classes (tools.py)."""
    tool_choice: ToolChoice | None
    """"auto", "none", "required", or one function: by name, as the tool itself, or an OpenAI dict."""
    parallel_tool_calls: bool | None
    """False: at most one tool call per answer (None leaves it to the server)."""


class LLMClient(RoleClient):
    """Chat and completions. Tools (`tools=`, `tool_choice=`) come back as
    `ChatResult.tool_calls`; `response_format=Model` (a pydantic class) asks for JSON that
    fits the model and returns a `ParsedChat[Model]` whose `.parsed` is the instance."""

    kind: ClassVar[Role] = Role.LLM

    @overload
    async def chat(
        self, messages: Sequence[MessageLike], *, response_format: type[M], **options: Unpack[ChatOptions]
    ) -> ParsedChat[M]: ...

    @overload
    async def chat(
        self,
        messages: Sequence[MessageLike],
        *,
        response_format: Mapping[str, Any] | None = None,
        **options: Unpack[ChatOptions],
    ) -> ChatResult: ...

    async def chat(
        self, messages: Sequence[MessageLike], *, response_format: ResponseFormat = None, **options: Unpack[ChatOptions]
    ) -> ChatResult:
        """One answer. With `response_format=Model` the answer is validated into `Model`
        (StructuredOutputError, holding the text, if it does not fit); a response_format
        dict is sent unchanged and the answer left as text."""
        fields = self._chat_fields(messages, options, response_format)
        raw = await self._transport.post_json(CHAT_PATH, self._body(fields, options.get("extra_body")))
        result = chat_result(raw, self.endpoint.reasoning_fields)
        if isinstance(response_format, type):
            return parsed_chat(result, response_format)
        return result

    async def stream_chat(
        self, messages: Sequence[MessageLike], *, response_format: ResponseFormat = None, **options: Unpack[ChatOptions]
    ) -> AsyncIterator[ChatDelta]:
        """Deltas as the server sends them; with `stream_usage`, the last one carries usage.
        Tool calls come in pieces (`ChatDelta.tool_calls`; join them with a
        ToolCallAccumulator); a `response_format=Model` answer is streamed as text (validate
        the joined text with `parse_structured`). An endpoint without streaming gets one
        request, delivered as a single delta."""
        caps = self.endpoint.capabilities
        if not caps.streaming:  # the format goes as its dict: a stream's answer is text, never validated
            as_sent = response_format_value(response_format)
            yield _single_delta(await self.chat(messages, response_format=as_sent, **options))
            return
        fields = self._chat_fields(messages, options, response_format)
        fields["stream"] = True
        if caps.stream_usage:
            fields["stream_options"] = {"include_usage": True}
        async with self._transport.stream(CHAT_PATH, self._body(fields, options.get("extra_body"))) as response:
            async for event in sse_events(response):
                if event.get("choices") or event.get("usage"):
                    yield chat_delta(event, self.endpoint.reasoning_fields)

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Stop = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Completion:
        """A plain-text completion (/v1/completions): no chat template."""
        fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                  "stop": _stop(stop), "seed": seed}  # fmt: skip
        return completion(await self._transport.post_json("/v1/completions", self._body(fields, extra_body)))

    def _chat_fields(
        self, messages: Sequence[MessageLike], options: ChatOptions, response_format: ResponseFormat = None
    ) -> dict[str, Any]:
        """The call's own body fields (None = not sent; `extra_body` is layered by `_body`)."""
        _check_options(options)
        tools = [tool_schema(tool) for tool in options.get("tools") or ()]
        fields = {
            "messages": messages_to_wire(messages),
            "max_tokens": options.get("max_tokens"),
            "temperature": options.get("temperature"),
            "top_p": options.get("top_p"),
            "stop": _stop(options.get("stop")),
            "seed": options.get("seed"),
            "tools": tools or None,
            "tool_choice": tool_choice_value(options.get("tool_choice"), tools),
            "parallel_tool_calls": options.get("parallel_tool_calls"),
            "response_format": response_format_value(response_format),
            **thinking_fields(self.endpoint.thinking, options.get("enable_thinking")),
        }
        if self.endpoint.thinking is Thinking.SYSTEM_PROMPT:
            fields["messages"] = with_thinking_line(fields["messages"], options.get("enable_thinking"))
        return fields


class VLMClient(LLMClient):
    """An LLM that also reads images: build messages with `ChatMessage.user(text, images=[...])`.
    Refuses endpoints whose capabilities do not include `vision` (set by the preset, or
    `capabilities: {vision: true}` in models.yaml)."""

    kind: ClassVar[Role] = Role.VLM
    also: ClassVar[tuple[Role, ...]] = (Role.LLM,)
    """An LLM preset that reads images (nemotron_omni, or `capabilities: {vision: true}`) is a VLM too."""

    def __init__(self, endpoint: Endpoint, base_url: str) -> None:
        if not endpoint.capabilities.vision:
            raise ConfigError(
                f"role {endpoint.role!r} cannot be a VLM: its capabilities do not include vision "
                f"(preset {endpoint.preset.name}); set `capabilities: {{vision: true}}` if the model reads images"
            )
        super().__init__(endpoint, base_url)


def thinking_fields(thinking: Thinking, enable: bool | None) -> dict[str, Any]:
    """How `enable_thinking` goes on the wire. Nothing unless asked, and nothing for models
    without a switch (DeepSeek-R1 and gpt-oss always think: False cannot be honoured)."""
    if enable is None or thinking is not Thinking.CHAT_TEMPLATE_KWARGS:
        return {}
    return {"chat_template_kwargs": {"enable_thinking": enable}}


THINKING_LINE = re.compile(r"^[ \t]*detailed thinking (?:on|off)[ \t]*\n?", re.IGNORECASE | re.MULTILINE)


def with_thinking_line(messages: list[dict[str, Any]], enable: bool | None) -> list[dict[str, Any]]:
    """Llama-Nemotron's switch: `detailed thinking on|off` as the first line of the system
    message, replacing one the caller wrote; a system message holding only it when the
    call has none. enable=None leaves the messages as they are (the model's default)."""
    if enable is None:
        return messages
    line = f"detailed thinking {'on' if enable else 'off'}"
    first = messages[0] if messages else None
    if first is None or first.get("role") != "system" or not isinstance(first.get("content"), str):
        return [{"role": "system", "content": line}, *messages]
    rest = THINKING_LINE.sub("", first["content"]).strip()
    return [{**first, "content": f"{line}\n{rest}" if rest else line}, *messages[1:]]


def _stop(stop: Stop) -> str | list[str] | None:
    return stop if stop is None or isinstance(stop, str) else list(stop)


def _check_options(options: ChatOptions) -> None:
    """A misspelt option raises, as a keyword argument would: `**options` alone takes anything
    at run time, and a silently dropped `max_token=` would be hard to see."""
    unknown = sorted(options.keys() - ChatOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"unexpected chat option(s): {', '.join(unknown)}")


def _single_delta(whole: ChatResult) -> ChatDelta:
    """A whole answer as the one delta of a stream (its tool calls as whole pieces)."""
    return ChatDelta(whole.content, whole.reasoning, whole.finish_reason, whole.usage,
                     whole_call_deltas(whole.tool_calls))  # fmt: skip
