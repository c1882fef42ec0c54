"""Stored responses as the Responses API route sees them: what is stored, and the store
(a Protocol: the runtime's bounded `ResponseStore` is one)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from modelpool.inference import ChatMessage, ImageInput, TextPart, VideoInput
from modelpool.owner import Owner

_OBJECT_BYTES = 200
"""What one message, part or call costs beyond its strings (the objects, the tuple slot)."""


@dataclass(frozen=True)
class StoredResponse:
    model: str
    conversation: tuple[ChatMessage, ...]
    """Everything said so far, this response's answer included."""
    owner: str = ""
    """The key that stored it (its config `name`; "" without keys)."""
    response: Mapping[str, Any] | None = None
    """The response object as the client got it (`GET /v1/responses/{id}` returns it)."""
    size: int = field(init=False)
    """Estimated bytes of memory the conversation and the response object hold."""

    def __post_init__(self) -> None:
        rendered = 0 if self.response is None else len(json.dumps(self.response)) + _OBJECT_BYTES
        object.__setattr__(self, "size", conversation_bytes(self.conversation) + rendered)


class ResponseStorage(Protocol):
    size: int
    """How many responses it keeps at most."""

    def get(self, response_id: str, caller: Owner) -> StoredResponse | None:
        """The response, if it is stored and `caller` may read it (None alike otherwise)."""

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Keep `stored`; False when it is not kept."""

    def delete(self, response_id: str, caller: Owner) -> bool:
        """Forget the response if `caller` may read it (False alike otherwise)."""


def conversation_bytes(conversation: tuple[ChatMessage, ...]) -> int:
    """An estimate of the memory a conversation holds: its strings as Python stores them
    (`sys.getsizeof`, which counts wide characters wide) and a fixed cost per object. A
    conversation that continues another shares its messages, so the sum over the store
    overstates what it holds: the budget errs on the safe side."""
    return sum(_message_bytes(message) for message in conversation)


def _message_bytes(message: ChatMessage) -> int:
    strings = [message.role, message.content, message.name or "", message.tool_call_id or ""]
    for call in message.tool_calls:
        strings += [call.id, call.name, call.arguments]
    for part in message.parts:
        if isinstance(part, TextPart):
            strings.append(part.text)
        elif isinstance(part, ImageInput):
            strings += [part.url, part.param, part.detail or "", part.data_uri or ""]
        elif isinstance(part, VideoInput):
            strings += [part.url, part.param, part.data_uri or ""]
    objects = 1 + len(message.tool_calls) + len(message.parts)
    return sum(sys.getsizeof(text) for text in strings) + objects * _OBJECT_BYTES
