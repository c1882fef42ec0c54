"""Content blocks of Anthropic's Messages API, and the turns they make, translated to the
pool's chat messages: `tool_use` blocks become an assistant message's tool calls,
`tool_result` blocks `tool` messages, images ImageInputs (data URIs or URLs)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from modelpool.errors import InvalidRequest
from modelpool.inference import ChatMessage, ContentPart, ImageInput, TextPart, ToolCall
from modelpool.wire.common import MAX_CONTENT_PARTS, Text, WireModel

Ignored = dict[str, Any] | None
"""A field Anthropic defines that means nothing to a local model (prompt caching)."""


class TextBlock(WireModel):
    type: Literal["text"]
    text: Text
    cache_control: Ignored = None
    citations: list[Any] | None = None


class Base64Source(WireModel):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class UrlSource(WireModel):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(WireModel):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]
    cache_control: Ignored = None

    def url(self) -> str:
        """As the pool takes images: a data URI, or the URL."""
        source = self.source
        return source.url if isinstance(source, UrlSource) else f"data:{source.media_type};base64,{source.data}"


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: Ignored = None

    def arguments(self) -> str:
        return json.dumps(self.input, ensure_ascii=False)


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: Text | list[ResultPart] | None = None
    is_error: bool | None = None
    cache_control: Ignored = None


class ThinkingBlock(WireModel):
    """Thinking sent back in the history: accepted and left out of the prompt, as chat
    templates leave earlier turns' reasoning out (its signature is not checked)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(WireModel):
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[Block], Field(max_length=MAX_CONTENT_PARTS)]


def to_chat_messages(system: str, messages: list[MessageParam]) -> tuple[ChatMessage, ...]:
    """Anthropic's turns → the pool's messages. A user turn's `tool_result` blocks become
    `tool` messages ahead of its other content (Anthropic puts them first); an empty last
    assistant turn is dropped, one with content refused."""
    said: list[ChatMessage] = [ChatMessage("system", system)] if system else []
    wheres: list[str] = ["system"] if system else []
    for index, message in enumerate(messages):
        where = f"messages[{index}].content"
        content = message.content
        blocks: list[Block] = [TextBlock(type="text", text=content)] if isinstance(content, str) else content
        turn = _user_turn(blocks, where) if message.role == "user" else [_assistant_turn(blocks, where)]
        for chat, param in turn:
            said.append(chat)
            wheres.append(param)
    if said and said[-1].role == "assistant":
        if said[-1].content or said[-1].tool_calls:
            # Anthropic continues a last assistant turn in place; the pool's chat templates
            # can only open a new turn, which would answer something else than was asked.
            raise InvalidRequest("a last assistant message (a prefill) is not supported here: the model answers "
                                 "in a turn of its own", param=wheres[-1])  # fmt: skip
        said.pop()
        wheres.pop()
    for chat, param in zip(said, wheres, strict=True):
        if chat.role in ("user", "system") and not chat.content and not chat.parts:
            raise InvalidRequest(f"a {chat.role} message must have non-empty content", param=param)
    _check_results(said, wheres)
    return tuple(said)


def _check_results(said: list[ChatMessage], wheres: list[str]) -> None:
    """Every tool_result answers a tool_use of an earlier assistant turn (the chat check's
    rule, in Anthropic's words)."""
    called: set[str] = set()
    for chat, where in zip(said, wheres, strict=True):
        called.update(call.id for call in chat.tool_calls)
        if chat.role == "tool" and chat.tool_call_id not in called:
            raise InvalidRequest(f"the tool_result for '{chat.tool_call_id}' answers no tool_use block of an "
                                 "earlier assistant message", param=where)  # fmt: skip


def _user_turn(blocks: list[Block], where: str) -> list[tuple[ChatMessage, str]]:
    results: list[tuple[ChatMessage, str]] = []
    texts: list[str] = []
    parts: list[ContentPart] = []
    for index, block in enumerate(blocks):
        param = f"{where}[{index}]"
        if isinstance(block, ToolResultBlock):
            results.append((_tool_message(block, param), f"{param}.tool_use_id"))
        elif isinstance(block, TextBlock):
            texts.append(block.text)
            parts.append(TextPart(block.text))
        elif isinstance(block, ImageBlock):
            parts.append(ImageInput(block.url(), param))
        else:
            raise InvalidRequest(f"a user message cannot hold '{block.type}' blocks", param=param)
    if not texts and not parts and results:
        return results
    has_image = any(isinstance(p, ImageInput) for p in parts)
    user = ChatMessage("user", "\n".join(texts), parts=tuple(parts) if has_image else ())
    return [*results, (user, where)]


def _assistant_turn(blocks: list[Block], where: str) -> tuple[ChatMessage, str]:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCall(block.id, block.name, block.arguments()))
        elif not isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            raise InvalidRequest(f"an assistant message cannot hold '{block.type}' blocks", param=f"{where}[{index}]")
    return ChatMessage("assistant", "".join(texts), tool_calls=tuple(calls)), where


def _tool_message(block: ToolResultBlock, param: str) -> ChatMessage:
    content = block.content
    if isinstance(content, list):
        if any(isinstance(part, ImageBlock) for part in content):
            raise InvalidRequest("images in tool results are not supported; send them in a user message",
                                 param=f"{param}.content")  # fmt: skip
        content = "\n".join(part.text for part in content if isinstance(part, TextBlock))
    # Chat templates have no field for a failed call: the model reads it from the text.
    text = f"Error: {content or ''}" if block.is_error else content or ""
    return ChatMessage("tool", text, tool_call_id=block.tool_use_id)
