"""The transcript store's index on disk: the journal of new sources, its folding into the
sidecar, and what a crash or another process can leave behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelpool.mcp_server import source_index
from modelpool.mcp_server.identity import JOURNAL, SIDECAR
from modelpool.mcp_server.source_index import SourceIndex
from modelpool.mcp_server.transcripts import TranscriptStore


def added(index: SourceIndex, *sources: str, owner: str = "") -> list[str]:
    with index.locked():
        index.merge()
        return [index.add((owner, source)) for source in sources]


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_source_still_lands(tmp_path: Path) -> None:
    added(SourceIndex(tmp_path), "first")
    with (tmp_path / JOURNAL).open("ab") as journal:
        journal.write(b'{"file": "torn.jsonl", "own')  # the process died mid-line
    index = SourceIndex(tmp_path)
    assert set(index.files()) == {"first.jsonl"}
    added(index, "second")
    assert set(SourceIndex(tmp_path).files()) == {"first.jsonl", "second.jsonl"}


def test_lines_that_are_not_sources_of_this_directory_are_skipped(tmp_path: Path) -> None:
    tmp_path.joinpath(JOURNAL).write_text(
        "not json\n"
        + json.dumps({"file": "../outside.jsonl", "owner": "", "source": "x"}) + "\n"
        + json.dumps({"file": "fine.jsonl", "owner": 3, "source": "x"}) + "\n"
        + json.dumps(["a", "list"]) + "\n"
        + json.dumps({"file": "good.jsonl", "owner": "alice", "source": "room"}) + "\n"
    )  # fmt: skip
    assert SourceIndex(tmp_path).files() == {"good.jsonl": ("alice", "room")}


def test_a_crash_between_the_fold_and_emptying_the_journal_reads_the_same_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_index, "FOLD_AT_LEAST", 3)
    index = SourceIndex(tmp_path)
    added(index, "a", "b")
    kept = tmp_path.joinpath(JOURNAL).read_bytes()
    added(index, "c")  # folds: the sidecar holds a, b, c and the journal is emptied
    assert len(json.loads(tmp_path.joinpath(SIDECAR).read_text())["files"]) == 3
    tmp_path.joinpath(JOURNAL).write_bytes(kept)  # as if the process died before emptying it
    again = SourceIndex(tmp_path)
    assert sorted(again.files()) == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert added(again, "a2") == ["a2.jsonl"]


def test_an_index_follows_another_process_that_folded_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_index, "FOLD_AT_LEAST", 4)
    mine, theirs = SourceIndex(tmp_path), SourceIndex(tmp_path)
    added(mine, "m1", "m2")
    added(theirs, "t1", "t2")  # their fourth line folds the journal: mine's offset is past its end
    assert (tmp_path / JOURNAL).stat().st_size == 0
    added(theirs, "t3")
    assert added(mine, "m3") == ["m3.jsonl"]
    expected = {f"{name}.jsonl" for name in ("m1", "m2", "m3", "t1", "t2", "t3")}
    assert set(mine.files()) == expected and set(SourceIndex(tmp_path).files()) == expected


def test_the_same_source_id_of_two_keys_gets_two_files(tmp_path: Path) -> None:
    index = SourceIndex(tmp_path)
    assert added(index, "room", owner="alice") + added(index, "room", owner="bob") == ["room.jsonl", "room-2.jsonl"]
    assert SourceIndex(tmp_path).file_of(("bob", "room")) == "room-2.jsonl"


def test_a_store_of_an_older_version_with_only_a_sidecar_still_loads_and_grows(tmp_path: Path) -> None:
    (tmp_path / "room.jsonl").write_text(json.dumps({"text": "old", "start": 0, "end": 1}) + "\n")
    (tmp_path / SIDECAR).write_text(json.dumps({"version": 1, "files": {"room.jsonl": "room"}}))
    TranscriptStore(tmp_path).add("hall", "new", 0, 1)
    assert {s.source_id: s.entries for s in TranscriptStore(tmp_path).sources()} == {"room": 1, "hall": 1}
