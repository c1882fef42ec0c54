"""The transcript store under a hostile or careless writer (issue 27, item 6): every bound
is refused whole with a clear error, a new source costs no work in the others, processes
sharing the directory keep each other's sources, and the sidecar is on the disk before it
replaces the old one.

Before: no bound at all (sources, entries, bytes and speaker names grew until memory ran
out), a new source listed the directory, scanned every known source and rewrote
`sources.json` whole (10,000 sources: 138 s of rewriting, 28 ms a source at the end), and
each process rewrote it from its own view, so another's sources vanished at the next start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from modelpool.errors import InvalidRequest, StoreFull
from modelpool.mcp_server import identity, source_index
from modelpool.mcp_server.identity import JOURNAL, SIDECAR, SourceKey
from modelpool.mcp_server.source_index import SourceIndex
from modelpool.mcp_server.transcripts import TranscriptLimits, TranscriptStore
from modelpool.server.app import create_app
from tests.e2e.mcp_helpers import call, mcp_client, mcp_config
from tests.live_server import live_server

SMALL = TranscriptLimits(max_sources=3, max_entries_per_source=4, max_bytes=4_000, max_speaker_chars=8)


def recorded_sources(directory: Path) -> list[str]:
    """The source ids the directory records (sidecar and journal), as a fresh index reads them."""
    return [source for _, source in SourceIndex(directory).files().values()]


def disk_state(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def test_every_bound_is_refused_whole_and_nothing_is_written(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path, SMALL)
    store.add_many("a", [("one", 0, 1, None), ("two", 1, 2, None)])
    before, entries = disk_state(tmp_path), store.stats().entries

    with pytest.raises(StoreFull, match="limit is 4") as full:  # 2 held + 3 > 4 entries
        store.add_many("a", [("x", 2, 3, None)] * 3)
    assert (full.value.status_code, full.value.code, full.value.param) == (413, "store_full", "source_id")
    with pytest.raises(InvalidRequest, match="at most 8 characters") as long_speaker:
        store.add("a", "hi", 3, 4, speaker="s" * 9)
    assert long_speaker.value.param == "speaker"
    store.add("b", "b", 0, 1)
    store.add("c", "c", 0, 1)
    before, entries = disk_state(tmp_path), store.stats().entries
    with pytest.raises(StoreFull, match="limit of 3 sources"):
        store.add("d", "a fourth source", 0, 1)
    with pytest.raises(StoreFull, match="limit of 4000"):
        store.add("b", "y" * 3_900, 1, 2)  # a known source, but past the bytes
    assert disk_state(tmp_path) == before and store.stats().entries == entries
    assert "d" not in recorded_sources(tmp_path)
    store.add("a", "still room", 5, 6, speaker="s" * 8)  # at the bounds themselves: accepted


def test_the_bounds_hold_after_a_restart(tmp_path: Path) -> None:
    TranscriptStore(tmp_path, SMALL).add_many("a", [("x" * 1_000, i, i + 1, None) for i in range(3)])
    reopened = TranscriptStore(tmp_path, SMALL)
    assert 3_000 < reopened.total_bytes < 4_000
    with pytest.raises(StoreFull):
        reopened.add("b", "z" * 1_000, 0, 1)
    with pytest.raises(StoreFull):
        reopened.add_many("a", [("ok", 9, 10, None)] * 2)


def test_a_flood_of_new_sources_stops_at_the_bound(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path, TranscriptLimits(60, 10, 1 << 20, 8))
    for i in range(60):
        store.add(f"flood/{i}", "x", 0, 1)
    with pytest.raises(StoreFull):
        store.add("flood/60", "x", 0, 1)
    assert len(recorded_sources(tmp_path)) == 60
    assert len(list(tmp_path.glob("*.jsonl"))) == 60


async def test_a_full_store_is_a_clear_mcp_error(tmp_path: Path) -> None:
    config = mcp_config(tmp_path, preload=False, transcript_max_entries_per_source=1)
    async with live_server(create_app(config)) as url, mcp_client(url) as client:
        await call(client, "add_transcript", source_id="s", text="first", start=0, end=1)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("add_transcript", {"source_id": "s", "text": "second", "start": 1, "end": 2})
    assert refused.value.error.data == {"status": 413, "type": "invalid_request_error", "code": "store_full",
                                        "param": "source_id"}  # fmt: skip
    assert "limit is 1" in refused.value.error.message


# ----- work done by a write ------------------------------------------------------------


class FileActivity:
    """The files opened and directories listed while `recording()` runs (audit events)."""

    installed: FileActivity | None = None

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] | None = None
        sys.addaudithook(self._hook)  # hooks cannot be removed: one per process, inert when idle

    @classmethod
    def get(cls) -> FileActivity:
        if cls.installed is None:
            cls.installed = cls()
        return cls.installed

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.events is not None and event in ("open", "os.listdir", "os.scandir"):
            target = args[0] if args else None
            if isinstance(target, str | bytes | os.PathLike):
                self.events.append((event, os.path.basename(os.fsdecode(target))))

    def recording(self) -> Iterator[list[tuple[str, str]]]:
        self.events = []
        try:
            yield self.events
        finally:
            self.events = None


@pytest.fixture
def file_activity() -> Iterator[list[tuple[str, str]]]:
    yield from FileActivity.get().recording()


def test_a_new_source_touches_no_other_source(tmp_path: Path, file_activity: list[tuple[str, str]]) -> None:
    store = TranscriptStore(tmp_path)
    for i in range(100):
        store.add(f"other/{i}", "x", 0, 1)
    file_activity.clear()
    store.add("newcomer", "hello", 0, 1)
    opened = {name for event, name in file_activity if event == "open"}
    assert not [event for event, _ in file_activity if event != "open"], "the directory was listed"
    # The lock, the journal (one line appended), the new file: not the sidecar, no other source.
    assert opened == {".lock", JOURNAL, "newcomer.jsonl"}, opened

    file_activity.clear()
    store.add("other/7", "again", 1, 2)  # a known source: its file and the lock alone
    assert {name for _, name in file_activity} == {".lock", "other_7.jsonl"}


def test_the_sidecar_is_rewritten_a_constant_number_of_times_per_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding the journal into the sidecar rewrites every source, so it happens only when
    the journal has grown to half the sidecar: sources written, summed over the folds, stay
    within a small multiple of the sources added (before: every new source rewrote all)."""
    rewritten: list[int] = []
    write = identity.write_sidecar

    def counted(directory: Path, files: dict[str, SourceKey]) -> None:
        rewritten.append(len(files))
        write(directory, files)

    monkeypatch.setattr(identity, "write_sidecar", counted)
    monkeypatch.setattr(source_index, "FOLD_AT_LEAST", 10)
    store = TranscriptStore(tmp_path)
    for i in range(300):
        store.add(f"s/{i}", "x", 0, 1)
    assert 3 <= len(rewritten) <= 12 and sum(rewritten) <= 3 * 300, rewritten  # before: 45,150 in 300 rewrites
    assert len(recorded_sources(tmp_path)) == 300
    assert len(json.loads((tmp_path / SIDECAR).read_text())["files"]) == rewritten[-1]


def test_a_new_source_reads_only_what_another_process_added_since(
    tmp_path: Path, file_activity: list[tuple[str, str]]
) -> None:
    mine, theirs = TranscriptStore(tmp_path), TranscriptStore(tmp_path)
    for i in range(20):
        mine.add(f"mine/{i}", "x", 0, 1)
    theirs.add("theirs", "from the other store", 0, 1)
    file_activity.clear()
    mine.add("newcomer", "x", 0, 1)
    opened = {name for event, name in file_activity if event == "open"}
    assert opened == {".lock", JOURNAL, "theirs.jsonl", "newcomer.jsonl"}  # the other's one new source, once
    assert [e.text for e in mine.query(source_id="theirs")] == ["from the other store"]


# ----- processes sharing a directory ---------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from modelpool.mcp_server import source_index
    from modelpool.mcp_server.transcripts import TranscriptStore
    from modelpool.owner import Owner

    source_index.FOLD_AT_LEAST = 4  # the sidecar rewritten whole often, by both
    store = TranscriptStore(Path(sys.argv[1]))  # both load the same (empty) view first
    print("ready", flush=True)
    sys.stdin.readline()  # the test starts both at once
    name = sys.argv[2]
    for i in range(int(sys.argv[3])):
        store.add(f"{name}/{i}", f"{name} said {i}", i, i + 1, caller=Owner(name))
        store.add("shared", f"{name} shared {i}", i, i + 1)
    print("done", flush=True)
""")


def test_two_processes_on_one_directory_keep_each_others_sources(tmp_path: Path) -> None:
    command = [sys.executable, "-c", WRITER, str(tmp_path)]
    pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    writers = [subprocess.Popen([*command, name, "25"], **pipes) for name in ("alpha", "beta")]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert writer.wait(timeout=120) == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            for pipe in (writer.stdin, writer.stdout):
                if pipe is not None:
                    pipe.close()
    store = TranscriptStore(tmp_path)
    sources = {(s.owner, s.source_id): s.entries for s in store.sources()}
    expected = {(name, f"{name}/{i}"): 1 for name in ("alpha", "beta") for i in range(25)}
    assert sources == {**expected, ("", "shared"): 50}  # one file for the shared source, no line lost
    assert store.stats().skipped_lines == 0
    assert len(recorded_sources(tmp_path)) == 51
    assert len(list(tmp_path.glob("*.jsonl"))) == 51


def test_two_stores_made_before_either_writes_keep_each_others_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race, made certain: each store holds the empty view it loaded, and each
    rewrites the sidecar whole from its own view at its second new source."""
    monkeypatch.setattr(source_index, "FOLD_AT_LEAST", 2)
    first, second = TranscriptStore(tmp_path), TranscriptStore(tmp_path)
    first.add("from-first", "one", 0, 1)
    second.add("from-second", "two", 0, 1)
    first.add("from-first-again", "three", 0, 1)
    assert {s.source_id for s in TranscriptStore(tmp_path).sources()} == {"from-first", "from-second",
                                                                          "from-first-again"}  # fmt: skip


# ----- what names a source reaches the disk before the source's file is written --------


def test_the_journal_and_the_sidecar_are_flushed_to_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd: int) -> None:
        steps.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        fsync(fd)

    def recorded_replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        steps.append(("replace", f"{os.path.basename(source)}->{os.path.basename(target)}"))
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)  # the os module identity writes through
    monkeypatch.setattr(os, "replace", recorded_replace)
    monkeypatch.setattr(source_index, "FOLD_AT_LEAST", 2)
    store = TranscriptStore(tmp_path)
    store.add("room", "hello", 0, 1)
    assert steps == [("fsync", JOURNAL), ("fsync", tmp_path.name)]  # its line, and the new journal's name
    steps.clear()
    store.add("hall", "hello", 0, 1)  # the second journal line: folded into the sidecar
    assert steps == [
        ("fsync", JOURNAL),
        ("fsync", f".{SIDECAR}.tmp"),  # the new sidecar is on the disk ...
        ("replace", f".{SIDECAR}.tmp->{SIDECAR}"),  # ... before it takes the old one's place
        ("fsync", tmp_path.name),  # and the rename itself is flushed with the directory
    ]
    assert (tmp_path / JOURNAL).stat().st_size == 0
    assert sorted(recorded_sources(tmp_path)) == ["hall", "room"]


def test_a_store_reads_the_sources_another_process_added(tmp_path: Path) -> None:
    mine, theirs = TranscriptStore(tmp_path), TranscriptStore(tmp_path)
    theirs.add("theirs", "added by the other process", 0, 1)
    assert [e.text for e in mine.query(source_id="theirs")] == ["added by the other process"]
    assert {s.source_id for s in mine.sources()} == {"theirs"}
