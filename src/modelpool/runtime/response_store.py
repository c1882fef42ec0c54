"""Stored responses for `previous_response_id`: a bounded LRU, in memory, per server.

The bound is a count (`server.response_store_size`, default 1024 responses): the least
recently stored or used response is dropped first, and a restart forgets them all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from modelpool.inference import ChatMessage


@dataclass(frozen=True)
class StoredResponse:
    model: str
    conversation: tuple[ChatMessage, ...]
    """Everything said so far, this response's answer included."""


class ResponseStore:
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        found = self._items.get(response_id)
        if found is not None:
            self._items.move_to_end(response_id)
        return found

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.size <= 0:
            return
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
