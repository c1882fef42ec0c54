"""Stored responses for `previous_response_id`: a bounded LRU, in memory, per server.

Two bounds, whichever bites first: a count (`server.response_store_size`, default 1024)
and an estimate of the memory the conversations take (`server.response_store_bytes`).
Past a bound, the key holding the most (responses, or bytes) gives up its least recently
stored or used response: a key that stores without end pushes out its own, not another
key's. A restart forgets them all.

A response belongs to the key that stored it: another key asking for it is told what it
would be told for an id that never existed, so ids cannot be probed (the admin scope
reads every key's).
"""

from __future__ import annotations

from collections import OrderedDict

from modelpool.owner import Owner
from modelpool.pool_api.responses import StoredResponse


class ResponseStore:
    """A `ResponseStorage`. Not thread-safe: the event loop alone uses it (a get or put is a
    few dict steps)."""

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bytes = 0
        """Estimated bytes the stored conversations take together."""
        self._items: dict[str, StoredResponse] = {}
        self._owners: dict[str, _Holding] = {}
        """Each key's responses, least recently stored or used first, and their bytes."""

    def get(self, response_id: str, caller: Owner) -> StoredResponse | None:
        """The response, if it is stored and `caller` may read it (None alike otherwise)."""
        found = self._items.get(response_id)
        if found is None or not caller.sees(found.owner):
            return None
        self._owners[found.owner].ids.move_to_end(response_id)
        return found

    def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Keep `stored`, dropping the least recently used past either bound. False when it
        is not kept: the store is off, or this one conversation is larger than the budget."""
        if self.size <= 0 or stored.size > self.max_bytes:
            return False
        self._drop(response_id)
        self._items[response_id] = stored
        holding = self._owners.setdefault(stored.owner, _Holding())
        holding.ids[response_id] = None
        holding.bytes += stored.size
        self.bytes += stored.size
        while len(self._items) > self.size or self.bytes > self.max_bytes:
            by_bytes = self.bytes > self.max_bytes
            largest = max(self._owners.values(), key=lambda h: h.bytes if by_bytes else len(h.ids))
            self._drop(next(iter(largest.ids)))
        return True

    def delete(self, response_id: str, caller: Owner) -> bool:
        """Forget the response if `caller` may read it (False alike otherwise)."""
        found = self._items.get(response_id)
        if found is None or not caller.sees(found.owner):
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        dropped = self._items.pop(response_id, None)
        if dropped is None:
            return
        self.bytes -= dropped.size
        holding = self._owners[dropped.owner]
        del holding.ids[response_id]
        holding.bytes -= dropped.size
        if not holding.ids:
            del self._owners[dropped.owner]

    def __len__(self) -> int:
        return len(self._items)


class _Holding:
    """One key's stored responses, least recently stored or used first, and their bytes."""

    def __init__(self) -> None:
        self.ids: OrderedDict[str, None] = OrderedDict()
        self.bytes = 0
