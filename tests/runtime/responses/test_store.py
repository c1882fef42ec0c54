from __future__ import annotations

from modelpool.inference import ChatMessage, ImageInput, TextPart, ToolCall
from modelpool.owner import ANONYMOUS, Owner
from modelpool.pool_api.responses import StoredResponse, conversation_bytes
from modelpool.runtime.responses.store import ResponseStore

ALICE, BOB, ADMIN = Owner("alice"), Owner("bob"), Owner("ops", admin=True)
PLENTY = 1 << 30


def stored(text: str, owner: str = "") -> StoredResponse:
    return StoredResponse("m", (ChatMessage("user", text),), owner)


def test_the_store_keeps_the_most_recently_used_up_to_its_size() -> None:
    store = ResponseStore(2, PLENTY)
    store.put("a", stored("a"))
    store.put("b", stored("b"))
    assert store.get("a", ANONYMOUS) is not None  # a is now the most recent
    store.put("c", stored("c"))
    assert store.get("b", ANONYMOUS) is None
    assert store.get("a", ANONYMOUS) is not None and store.get("c", ANONYMOUS) is not None
    assert len(store) == 2
    off = ResponseStore(0, PLENTY)
    assert not off.put("a", stored("a"))
    assert off.get("a", ANONYMOUS) is None


def test_a_key_reads_only_its_own_responses_and_the_admin_scope_reads_all() -> None:
    store = ResponseStore(10, PLENTY)
    store.put("resp_a", stored("alice's", "alice"))
    assert store.get("resp_a", ALICE) is not None
    assert store.get("resp_a", BOB) is None  # the same answer as for an id never stored
    assert store.get("resp_a", ADMIN) is not None and store.get("resp_a", ANONYMOUS) is not None


def test_another_keys_read_does_not_refresh_the_response() -> None:
    store = ResponseStore(2, PLENTY)
    store.put("a", stored("a", "alice"))
    store.put("b", stored("b", "alice"))
    assert store.get("a", BOB) is None  # must not make a the most recent
    store.put("c", stored("c", "alice"))
    assert store.get("a", ALICE) is None and store.get("b", ALICE) is not None


def test_the_byte_budget_drops_the_least_recently_used() -> None:
    one = stored("x" * 10_000)
    store = ResponseStore(1000, 3 * one.size + 10)
    for name in "abc":
        assert store.put(name, stored("x" * 10_000))
    assert store.get("a", ANONYMOUS) is not None  # b is now the least recent
    store.put("d", stored("x" * 10_000))
    assert store.get("b", ANONYMOUS) is None
    assert [store.get(name, ANONYMOUS) is not None for name in "acd"] == [True, True, True]
    assert store.bytes == 3 * one.size <= store.max_bytes
    huge = stored("x" * 40_000)
    assert not store.put("e", huge)  # alone larger than the budget: not kept, nothing dropped for it
    assert len(store) == 3 and store.get("e", ANONYMOUS) is None


def test_putting_an_id_again_replaces_it_without_counting_it_twice() -> None:
    store = ResponseStore(10, PLENTY)
    store.put("a", stored("one"))
    store.put("a", stored("two"))
    assert len(store) == 1 and store.bytes == stored("two").size


def test_the_estimate_counts_text_calls_and_images() -> None:
    text = ChatMessage("user", "hello")
    wide = ChatMessage("user", "h\U0001f600" * 1000)  # 4 bytes a character in memory
    image = ChatMessage("user", "", parts=(TextPart("see"), ImageInput("data:image/png;base64," + "A" * 50_000, "p")))
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "f", "{" + '"a": 1,' * 1000 + "}"),))
    assert conversation_bytes((text,)) < 1_000
    assert conversation_bytes((wide,)) > 8_000
    assert conversation_bytes((image,)) > 50_000
    assert conversation_bytes((call,)) > 7_000
    assert conversation_bytes((text, image)) == conversation_bytes((text,)) + conversation_bytes((image,))


def test_a_key_that_stores_without_end_pushes_out_its_own_not_anothers() -> None:
    store = ResponseStore(4, PLENTY)
    store.put("a1", stored("a", "alice"))
    store.put("a2", stored("a", "alice"))
    for index in range(10):
        store.put(f"b{index}", stored("b", "bob"))
    assert store.get("a1", ALICE) is not None and store.get("a2", ALICE) is not None
    assert [name for name in (f"b{i}" for i in range(10)) if store.get(name, BOB)] == ["b8", "b9"]
    store.put("a3", stored("a", "alice"))  # the count is full and level: the larger holder gives way
    assert store.get("a3", ALICE) is not None and len(store) == 4


def test_by_bytes_the_key_holding_the_most_bytes_gives_way() -> None:
    small, large = stored("x" * 100, "alice"), stored("x" * 10_000, "bob")
    store = ResponseStore(1000, 3 * large.size + 5 * small.size)
    for index in range(5):
        store.put(f"a{index}", stored("x" * 100, "alice"))
    for index in range(10):
        store.put(f"b{index}", stored("x" * 10_000, "bob"))
    assert all(store.get(f"a{index}", ALICE) is not None for index in range(5))
    assert store.bytes <= store.max_bytes
