from __future__ import annotations

from modelpool.inference import ChatMessage
from modelpool.runtime.response_store import ResponseStore, StoredResponse


def stored(text: str) -> StoredResponse:
    return StoredResponse("m", (ChatMessage("user", text),))


def test_the_store_keeps_the_most_recently_used_up_to_its_size() -> None:
    store = ResponseStore(2)
    store.put("a", stored("a"))
    store.put("b", stored("b"))
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", stored("c"))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert len(store) == 2
    off = ResponseStore(0)
    off.put("a", stored("a"))
    assert off.get("a") is None
