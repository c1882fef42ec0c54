"""Stored responses for `previous_response_id`: a bounded LRU, in memory, per server.

Two bounds, whichever bites first: a count (`server.response_store_size`, default 1024)
and an estimate of the memory the conversations take (`server.response_store_bytes`). The
least recently stored or used response is dropped first, and a restart forgets them all.

A response belongs to the key that stored it: another key asking for it is told what it
would be told for an id that never existed, so ids cannot be probed (the admin scope
reads every key's).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, field

from modelpool.inference import ChatMessage, ImageInput, TextPart
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
    size: int = field(init=False)
    """Estimated bytes of memory the conversation holds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", conversation_bytes(self.conversation))


class ResponseStore:
    """Not thread-safe: the event loop alone uses it (a get or put is a few dict steps)."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        """Estimated bytes the stored conversations take together."""
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str, caller: Owner) -> StoredResponse | None:
        """The response, if it is stored and `caller` may read it (None alike otherwise)."""
        found = self._items.get(response_id)
        if found is None or not caller.sees(found.owner):
            return None
        self._items.move_to_end(response_id)
        return found

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Keep `stored`, dropping the least recently used past either bound. False when it
        is not kept: the store is off, or this one conversation is larger than the budget."""
        if self.size <= 0 or stored.size > self.max_bytes:
            return False
        self._drop(response_id)
        self._items[response_id] = stored
        self.bytes += stored.size
        while len(self._items) > self.size or self.bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    def _drop(self, response_id: str) -> None:
        dropped = self._items.pop(response_id, None)
        if dropped is not None:
            self.bytes -= dropped.size

    def __len__(self) -> int:
        return len(self._items)


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
    objects = 1 + len(message.tool_calls) + len(message.parts)
    return sum(sys.getsizeof(text) for text in strings) + objects * _OBJECT_BYTES
