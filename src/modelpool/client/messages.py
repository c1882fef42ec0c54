"""Chat messages, including images as OpenAI `image_url` parts and the two messages of a
tool round: the assistant's calls and each tool's output.

Local images (bytes, or a path) travel inline as base64 data URIs with their real MIME
type, so a server never needs to reach back to the caller's disk or network.

    reply = await llm.chat(history, tools=[get_weather])
    history.append(ChatMessage.from_result(reply))  # the calls must precede their outputs
    for call in reply.tool_calls:
        history.append(ChatMessage.tool(call.id, get_weather(**call.args)))
    final = await llm.chat(history, tools=[get_weather])
"""

from __future__ import annotations

import base64
import json
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from modelpool.client.results import ChatResult, ToolCall

ContentPart = dict[str, Any]
ImageSource = bytes | Path | str
"""Raw image bytes, a local file, an `http(s)://` URL or a `data:` URI."""

_MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str | list[ContentPart] | None
    """Text, or a list of OpenAI content parts (`text`, `image_url`, `input_audio`); None
    only for an assistant message that just calls tools."""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant message's calls (they must come before the tool messages answering them)."""
    tool_call_id: str | None = None
    """A tool message's: the id of the call it answers."""

    @classmethod
    def system(cls, text: str) -> ChatMessage:
        return cls("system", text)

    @classmethod
    def user(cls, text: str, *, images: Sequence[ImageSource] = ()) -> ChatMessage:
        if not images:
            return cls("user", text)
        parts: list[ContentPart] = [{"type": "text", "text": text}] if text else []
        parts += [image_part(image) for image in images]
        return cls("user", parts)

    @classmethod
    def assistant(cls, text: str = "", *, tool_calls: Sequence[ToolCall] = ()) -> ChatMessage:
        """An earlier answer; with tool calls and no text, the content goes as null (the
        standard shape, which some chat templates need to tell a call from an empty answer)."""
        return cls("assistant", None if tool_calls and not text else text, tool_calls=tuple(tool_calls))

    @classmethod
    def from_result(cls, result: ChatResult) -> ChatMessage:
        """The assistant message that puts a reply (its text and tool calls) into the history."""
        return cls.assistant(result.content, tool_calls=result.tool_calls)

    @classmethod
    def tool(cls, call_id: str, content: object) -> ChatMessage:
        """A tool's output, answering the call `call_id`. Text goes as is; anything else
        (a pydantic model, a dict, a list, a number) as its JSON, the form models read
        tool outputs in."""
        return cls("tool", _tool_output(content), tool_call_id=call_id)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            wire["name"] = self.name
        if self.tool_calls:
            wire["tool_calls"] = [call.to_wire() for call in self.tool_calls]
        if self.tool_call_id is not None:
            wire["tool_call_id"] = self.tool_call_id
        return wire


MessageLike = ChatMessage | Mapping[str, Any]
"""A ChatMessage, or a message already in the wire format (`{"role": ..., "content": ...}`)."""


def messages_to_wire(messages: Sequence[MessageLike]) -> list[dict[str, Any]]:
    return [m.to_wire() if isinstance(m, ChatMessage) else dict(m) for m in messages]


def _tool_output(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, BaseModel):
        return content.model_dump_json()
    return json.dumps(content)


def image_part(image: ImageSource) -> ContentPart:
    return {"type": "image_url", "image_url": {"url": image_url(image)}}


def image_url(image: ImageSource) -> str:
    """A URL the server can read: remote URLs and data URIs as given, local images inlined."""
    if isinstance(image, str) and image.startswith(("http://", "https://", "data:")):
        return image
    if isinstance(image, bytes):
        return _data_uri(image, image_mime(image))
    path = Path(image)
    data = path.read_bytes()
    return _data_uri(data, image_mime(data, path.name))


def image_mime(data: bytes, filename: str | None = None) -> str:
    """The image's MIME type from its first bytes (a file name is only a fallback)."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    guessed = mimetypes.guess_type(filename)[0] if filename else None
    return guessed or "application/octet-stream"


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
