"""Chat messages, including images as OpenAI `image_url` parts.

Local images (bytes, or a path) travel inline as base64 data URIs with their real MIME
type, so a server never needs to reach back to the caller's disk or network.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    content: str | list[ContentPart]
    """Text, or a list of OpenAI content parts (`text`, `image_url`, `input_audio`)."""
    name: str | None = None

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
    def assistant(cls, text: str) -> ChatMessage:
        return cls("assistant", text)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            wire["name"] = self.name
        return wire


MessageLike = ChatMessage | Mapping[str, Any]
"""A ChatMessage, or a message already in the wire format (`{"role": ..., "content": ...}`)."""


def messages_to_wire(messages: Sequence[MessageLike]) -> list[dict[str, Any]]:
    return [m.to_wire() if isinstance(m, ChatMessage) else dict(m) for m in messages]


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
