"""The transcript store: raw source ids round-trip through colliding file names, filters,
a restart (a new store on the same directory), damaged files, and sources kept per key."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelpool.errors import ConfigError, InvalidRequest, StoreUnavailable
from modelpool.inference import Segment
from modelpool.mcp_server.identity import JOURNAL, SIDECAR, file_stem
from modelpool.mcp_server.source_index import SourceIndex
from modelpool.mcp_server.transcripts import TranscriptStore
from modelpool.owner import Owner

COLLIDING = ["room/1", "room:1", "room 1", "Room_1", "room_1"]


def texts(entries: list) -> list[str]:
    return [entry.text for entry in entries]


def test_ids_that_sanitise_alike_get_their_own_files_and_come_back_raw(tmp_path: Path) -> None:
    assert len({file_stem(raw).casefold() for raw in COLLIDING}) == 1  # the premise: one name for all
    store = TranscriptStore(tmp_path)
    for i, raw in enumerate(COLLIDING):
        store.add(raw, f"said in {raw}", start=i, end=i + 0.5)
    files = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert len({name.casefold() for name in files}) == len(COLLIDING)  # distinct on macOS and Windows too
    assert sorted(source for _, source in SourceIndex(tmp_path).files().values()) == sorted(COLLIDING)
    for reopened in (store, TranscriptStore(tmp_path)):  # and after a restart
        for raw in COLLIDING:
            found = reopened.query(source_id=raw)
            assert [(e.source_id, e.text) for e in found] == [(raw, f"said in {raw}")]
        assert sorted(s.source_id for s in reopened.sources()) == sorted(COLLIDING)


def test_file_names_are_safe_on_any_filesystem() -> None:
    assert file_stem("../../etc/passwd") == "etc_passwd"
    assert file_stem(".hidden") == "hidden"
    assert file_stem("日本語") == "source"
    assert len(file_stem("x" * 1000)) == 64
    assert [file_stem(name) for name in ("con", "NUL", "com1", "lpt9", "console")] == [
        "con_", "NUL_", "com1_", "lpt9_", "console"]  # fmt: skip


def test_a_new_store_on_the_same_directory_sees_everything(tmp_path: Path) -> None:
    first = TranscriptStore(tmp_path)
    first.add("a", "one", 0, 1, speaker="ann")
    first.add_many("b", [("two", 1, 3, None), ("three", 3, 4, "bob")])
    second = TranscriptStore(tmp_path)
    assert second.stats() == first.stats()
    assert texts(second.query()) == ["one", "two", "three"]
    second.add("a", "four", 5, 6)
    assert texts(TranscriptStore(tmp_path).query(source_id="a")) == ["one", "four"]


def test_query_filters(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    store.add_many("cam", [("Hello World", 0, 2, None), ("the weather", 2, 4, None), ("HELLO again", 10, 11, None)])
    store.add("mic", "hello from the mic", 3, 5)
    assert texts(store.query(text="hello")) == ["Hello World", "hello from the mic", "HELLO again"]
    assert texts(store.query(source_id="cam", text="hello")) == ["Hello World", "HELLO again"]
    # since/until keep entries whose span overlaps the window
    assert texts(store.query(since=4, until=9)) == ["the weather", "hello from the mic"]
    assert texts(store.query(since=4.5)) == ["hello from the mic", "HELLO again"]
    assert texts(store.query(until=1)) == ["Hello World"]
    assert texts(store.query(limit=2)) == ["hello from the mic", "HELLO again"]  # the latest, oldest first
    assert store.query(source_id="nobody") == []
    assert store.query(text="absent") == []


def test_segments_are_stored_shifted_and_without_blanks(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    segments = [Segment(0, 0.0, 1.5, " Hello there."), Segment(1, 1.5, 2.0, "  "), Segment(2, 2.0, 3.25, " Bye.")]
    store.add_segments("call", segments, offset=100)
    assert [(e.text, e.start, e.end) for e in store.query()] == [("Hello there.", 100, 101.5), ("Bye.", 102, 103.25)]


def test_stats(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    assert store.stats().entries == 0 and store.stats().first_start is None
    store.add_many("a", [("x", 10, 12, "ann"), ("y", 12, 15, "bob")])
    store.add("b", "z", 1, 1.5)
    stats = store.stats()
    assert (stats.sources, stats.entries, stats.duration_s) == (2, 3, 5.5)
    assert (stats.first_start, stats.last_end, stats.skipped_lines) == (1, 15, 0)
    by_id = {s.source_id: s for s in stats.per_source}
    assert (by_id["a"].entries, by_id["a"].duration_s, by_id["a"].speakers) == (2, 5, ["ann", "bob"])
    assert (by_id["b"].first_start, by_id["b"].last_end) == (1, 1.5)


def test_damaged_lines_are_skipped_counted_and_do_not_swallow_new_entries(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    store.add_many("s", [("first", 0, 1, None), ("second", 1, 2, None)])
    path = next(tmp_path.glob("*.jsonl"))
    lines = path.read_text().splitlines()
    # a broken line in the middle, and a last line cut off by a crash (no newline)
    path.write_text(f"{lines[0]}\nnot json\n{lines[1]}\n{json.dumps(['a list'])}\n{lines[1][:15]}")
    reopened = TranscriptStore(tmp_path)
    assert texts(reopened.query()) == ["first", "second"]
    assert reopened.stats().skipped_lines == 3
    reopened.add("s", "third", 2, 3)
    again = TranscriptStore(tmp_path)
    assert texts(again.query()) == ["first", "second", "third"]
    assert again.stats().skipped_lines == 3


def test_an_unreadable_sidecar_stops_the_store_rather_than_losing_the_mapping(tmp_path: Path) -> None:
    TranscriptStore(tmp_path).add("room/1", "hi", 0, 1)
    (tmp_path / SIDECAR).write_text("{broken")
    with pytest.raises(ConfigError, match=r"sources\.json"):
        TranscriptStore(tmp_path)


def test_a_sidecar_cannot_point_outside_the_directory(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (tmp_path / "secret.jsonl").write_text(json.dumps({"text": "secret", "start": 0, "end": 1}) + "\n")
    (store_dir / SIDECAR).write_text(json.dumps({"version": 1, "files": {"../secret.jsonl": "x"}}))
    assert TranscriptStore(store_dir).query() == []


def test_a_new_source_never_takes_an_unlisted_file(tmp_path: Path) -> None:
    """A file the sidecar does not name (copied in by hand) is left alone, not appended to."""
    (tmp_path / "room_1.jsonl").write_text("kept as it was\n")
    TranscriptStore(tmp_path).add("room/1", "new", 0, 1)
    assert (tmp_path / "room_1.jsonl").read_text() == "kept as it was\n"
    assert texts(TranscriptStore(tmp_path).query(source_id="room/1")) == ["new"]


def test_an_empty_store_writes_nothing_until_the_first_entry(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path / "later")
    assert store.stats().sources == 0
    assert not (tmp_path / "later").exists()
    store.add("a", "b", 0, 1)
    assert (tmp_path / "later" / JOURNAL).exists()


@pytest.mark.parametrize(
    ("source_id", "text", "start", "end", "param"),
    [
        ("", "hi", 0, 1, "source_id"),
        ("x" * 257, "hi", 0, 1, "source_id"),
        ("s", "", 0, 1, "text"),
        ("s", "   ", 0, 1, "text"),
        ("s", "hi", 2, 1, "end"),
        ("s", "hi", float("nan"), 1, "start"),
        ("s", "hi", 0, float("inf"), "end"),
        ("s", "x" * 65_537, 0, 1, "text"),
    ],
)
def test_bad_entries_are_refused_and_nothing_is_written(
    tmp_path: Path, source_id: str, text: str, start: float, end: float, param: str | None
) -> None:
    store = TranscriptStore(tmp_path)
    with pytest.raises(InvalidRequest) as caught:  # the good first item is not written either
        store.add_many(source_id, [("fine", 0, 1, None), (text, start, end, None)])
    assert caught.value.param == param
    assert store.stats().entries == 0
    assert not tmp_path.joinpath(JOURNAL).exists() and not tmp_path.joinpath(SIDECAR).exists()


def test_limits_outside_the_range_are_refused(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    for limit in (0, 10_001):
        with pytest.raises(InvalidRequest, match="limit"):
            store.query(limit=limit)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)

    def write(worker: int) -> None:
        for i in range(50):
            store.add(f"source/{worker % 3}", f"w{worker} n{i}", i, i + 1)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    reopened = TranscriptStore(tmp_path)
    assert reopened.stats().entries == 400 and reopened.stats().skipped_lines == 0
    assert sorted(texts(reopened.query(limit=1000))) == sorted(f"w{w} n{i}" for w in range(8) for i in range(50))


def test_a_store_that_cannot_write_says_so_and_keeps_nothing_half_done(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    store.add("room", "first", 0, 1)
    # Paths that cannot be written, even by root (tests may run as root, where chmod does not bite).
    room = tmp_path / f"{file_stem('room')}.jsonl"
    room.unlink()
    room.mkdir()
    journal = tmp_path / JOURNAL
    journal.unlink()
    journal.mkdir()  # where a new source is recorded first
    with pytest.raises(StoreUnavailable, match="cannot be written"):
        store.add("room", "second", 1, 2)
    with pytest.raises(StoreUnavailable):
        store.add("hall", "a new source", 0, 1)
    assert texts(store.query()) == ["first"]  # what failed to reach the disk is not served from memory


ALICE, BOB, OPS = Owner("alice"), Owner("bob"), Owner("ops", admin=True)


def test_a_source_belongs_to_its_key_and_the_admin_scope_reads_all(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    store.add("room", "alice speaking", 0, 1, caller=ALICE)
    store.add("room", "bob speaking", 2, 3, caller=BOB)  # the same id under another key: another source
    store.add("alice/only", "alice alone", 4, 5, caller=ALICE)
    for reopened in (store, TranscriptStore(tmp_path)):  # owners survive a restart
        assert texts(reopened.query(source_id="room", caller=BOB)) == ["bob speaking"]
        assert reopened.query(source_id="alice/only", caller=BOB) == []  # reads as an unknown source
        assert texts(reopened.query(caller=BOB)) == ["bob speaking"]
        assert [(s.owner, s.source_id) for s in reopened.sources(BOB)] == [("bob", "room")]
        assert reopened.stats(BOB).entries == 1
        assert [(e.owner, e.text) for e in reopened.query(source_id="room", caller=OPS)] == [
            ("alice", "alice speaking"), ("bob", "bob speaking")]  # fmt: skip
        assert reopened.stats(OPS).sources == 3 and reopened.stats(ALICE).sources == 2
    assert len(list(tmp_path.glob("*.jsonl"))) == 3


def test_an_owner_free_sidecar_of_an_older_version_reads_as_the_anonymous_owners(tmp_path: Path) -> None:
    (tmp_path / "room.jsonl").write_text(json.dumps({"text": "before keys", "start": 0, "end": 1}) + "\n")
    (tmp_path / SIDECAR).write_text(json.dumps({"version": 1, "files": {"room.jsonl": "room"}}))
    store = TranscriptStore(tmp_path)
    assert [(e.owner, e.text) for e in store.query()] == [("", "before keys")]  # ANONYMOUS: a keyless server
    assert store.query(caller=ALICE) == [] and texts(store.query(caller=OPS)) == ["before keys"]
    store.add("room", "alice's own room", 1, 2, caller=ALICE)
    assert texts(TranscriptStore(tmp_path).query(source_id="room", caller=ALICE)) == ["alice's own room"]
