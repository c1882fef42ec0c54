"""The transcript store: what was said, by which source, when.

Persisted as one JSONL file per source (one entry a line, appended) under a directory, with
the identity sidecar of `identity.py` naming the raw source id of each file. Everything is
also held in memory, loaded once when the store is made, so queries never touch the disk.
A line that cannot be read (a crash cut it short, a hand edit broke it) is skipped, logged
and counted in the stats; the entries around it still load.

Times (`start`, `end`) are seconds on whatever clock the source uses (Unix time for a live
stream, offsets into a recording); the store only compares them.

A source belongs to the API key that added to it: the same source id under two keys is
two sources, and a key reads only its own (the admin scope reads all; see
`owner.py`). The store is bounded (`TranscriptLimits`: sources, entries per
source, bytes, speaker length); past a bound a write is refused whole (413 `store_full`).

Several processes may share a directory (see `source_index.py`): no one loses another's
sources or interleaves lines with it. Each holds in memory what it loaded, what it wrote
and the sources the others added (read when it next reads or adds a source); entries the
others append later to sources it already holds reach it when it restarts.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from modelpool.config.schema import ServerConfig
from modelpool.errors import InvalidRequest, StoreFull, StoreUnavailable
from modelpool.inference import Segment
from modelpool.mcp_server.identity import SourceKey
from modelpool.mcp_server.source_index import SourceIndex
from modelpool.owner import ANONYMOUS, Owner

log = logging.getLogger("modelpool.transcripts")
MAX_LIMIT = 10_000
MAX_TEXT = 65_536
"""Characters of one entry (an utterance; a longer text is a document, not a transcript line)."""
_FROM_SIDECAR = {"source_id", "owner"}
"""Entry fields a stored line leaves out: the sidecar names them for the whole file."""


@dataclass(frozen=True)
class TranscriptLimits:
    """The store's bounds (the `server.transcript_max_*` settings)."""

    max_sources: int
    max_entries_per_source: int
    max_bytes: int
    max_speaker_chars: int

    @classmethod
    def of(cls, server: ServerConfig) -> TranscriptLimits:
        return cls(server.transcript_max_sources, server.transcript_max_entries_per_source,
                   server.transcript_max_bytes, server.transcript_max_speaker_chars)  # fmt: skip


class TranscriptEntry(BaseModel):
    """One utterance of one source."""

    model_config = ConfigDict(frozen=True)

    source_id: str = Field(min_length=1, max_length=256)
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    start: float
    """Seconds on the source's clock."""
    end: float
    speaker: str | None = None
    owner: str = ""
    """The API key (its config name) whose caller added it; empty on a server without keys."""
    added_at: float = Field(default_factory=time.time)
    """Unix time the store received it."""

    @field_validator("text")
    @classmethod
    def _words(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text must hold some words")
        return value

    @field_validator("start", "end")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    @field_validator("end")
    @classmethod
    def _not_before_start(cls, value: float, info: ValidationInfo) -> float:
        start = info.data.get("start")  # absent when start itself was invalid
        if start is not None and value < start:
            raise ValueError(f"end ({value}) is before start ({start})")
        return value


class SourceStats(BaseModel):
    source_id: str
    owner: str
    """The API key the source belongs to (empty: the server had no keys)."""
    entries: int
    duration_s: float
    """Sum of the entries' end - start."""
    first_start: float | None
    last_end: float | None
    speakers: list[str]


class StoreStats(BaseModel):
    sources: int
    entries: int
    duration_s: float
    first_start: float | None
    last_end: float | None
    skipped_lines: int
    """Lines of the files that could not be read when the store was loaded."""
    per_source: list[SourceStats]


class TranscriptStore:
    """Thread-safe: every read and write holds one lock (writes are single small appends).
    Writes also hold the directory's lock (`SourceIndex.locked`), so processes sharing the
    directory never interleave lines nor lose each other's sources."""

    def __init__(self, directory: Path, limits: TranscriptLimits | None = None) -> None:
        """Loads what `directory` holds (it need not exist: it is made on the first write)."""
        self.directory = directory
        self.limits = limits or TranscriptLimits.of(ServerConfig())
        self._lock = threading.Lock()
        self._index = SourceIndex(directory)
        self._entries: dict[str, dict[str, list[TranscriptEntry]]] = {}
        """Owner → source id → entries, in the order they were added."""
        self._bytes: dict[str, int] = {}
        """File name → its bytes, as last read or written."""
        self.total_bytes = 0
        self._unterminated: set[str] = set()
        self._skipped: dict[SourceKey, int] = {}
        """Lines that could not be read when the files were loaded, by source."""
        self._load_files(self._index.files())

    @property
    def skipped_lines(self) -> int:
        return sum(self._skipped.values())

    # ----- writing --------------------------------------------------------------------

    def add(
        self, source_id: str, text: str, start: float, end: float, speaker: str | None = None,
        caller: Owner = ANONYMOUS,
    ) -> TranscriptEntry:  # fmt: skip
        (entry,) = self.add_many(source_id, [(text, start, end, speaker)], caller)
        return entry

    def add_segments(
        self, source_id: str, segments: Iterable[Segment], offset: float = 0.0, caller: Owner = ANONYMOUS
    ) -> list[TranscriptEntry]:
        """A transcription's segments (blank ones skipped), their times shifted by `offset`."""
        timed = [(s.text.strip(), s.start + offset, s.end + offset, None) for s in segments]
        return self.add_many(source_id, [item for item in timed if item[0]], caller)

    def add_many(
        self, source_id: str, items: Iterable[tuple[str, float, float, str | None]], caller: Owner = ANONYMOUS
    ) -> list[TranscriptEntry]:
        """Check every item, then append them all to `caller`'s source `source_id` (nothing
        is written if one is invalid or a bound would be passed)."""
        entries = [self._entry(source_id, caller.name, *item) for item in items]
        if not entries:
            return []
        lines = "".join(entry.model_dump_json(exclude=_FROM_SIDECAR) + "\n" for entry in entries).encode()
        key = (caller.name, source_id)
        with self._lock:
            try:
                with self._index.locked():
                    name = self._file_for(key, len(entries), len(lines))
                    self._append(name, lines)
            except OSError as exc:  # a full disk, a read-only directory: the store's fault, not the caller's
                log.error("the transcript store cannot write to %s: %s", self.directory, exc)
                raise StoreUnavailable(f"the transcript store cannot be written ({exc.strerror})") from None
            self._entries.setdefault(caller.name, {}).setdefault(source_id, []).extend(entries)
        return entries

    def _file_for(self, key: SourceKey, adding: int, size: int) -> str:
        """The source's file, after checking the bounds; a new source is named and recorded
        in the sidecar (before its file is first appended to, so no file is ever anonymous)."""
        name = self._index.file_of(key)
        if name is None:  # what other processes added first: the source may be one of theirs
            self._catch_up()
            name = self._index.file_of(key)
        limits = self.limits
        if name is None and len(self._index) >= limits.max_sources:
            raise StoreFull(f"the transcript store holds its limit of {limits.max_sources} sources", param="source_id")
        held = len(self._entries.get(key[0], {}).get(key[1], []))
        if held + adding > limits.max_entries_per_source:
            raise StoreFull(f"source '{key[1]}' holds {held} entries; the limit is "
                            f"{limits.max_entries_per_source}", param="source_id")  # fmt: skip
        if self.total_bytes + size > limits.max_bytes:
            raise StoreFull(f"the transcript store holds {self.total_bytes} bytes; {size} more would pass "
                            f"its limit of {limits.max_bytes}")  # fmt: skip
        return self._index.add(key) if name is None else name

    def _append(self, name: str, lines: bytes) -> None:
        with (self.directory / name).open("ab") as out:
            if name in self._unterminated:  # a cut-off last line must not swallow the next entry
                out.write(b"\n")
                self._unterminated.discard(name)
            out.write(lines)
            self._count_bytes(name, out.tell())  # the file's end: other processes' appends included

    def _entry(
        self, source_id: str, owner: str, text: str, start: float, end: float, speaker: str | None
    ) -> TranscriptEntry:
        longest = self.limits.max_speaker_chars
        if speaker is not None and len(speaker) > longest:
            raise InvalidRequest(f"speaker: at most {longest} characters (got {len(speaker)})", param="speaker")
        return _entry(source_id, owner, text, start, end, speaker)

    # ----- reading --------------------------------------------------------------------

    def query(
        self,
        source_id: str | None = None,
        text: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        caller: Owner = ANONYMOUS,
    ) -> list[TranscriptEntry]:
        """Entries of one source (or all) that `caller` may read, whose text contains `text`
        (case-insensitive) and whose span overlaps [since, until]; the latest `limit` of
        them, oldest first. Another key's source reads as an unknown one: empty."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", param="limit")
        needle = text.casefold() if text else None
        with self._lock:
            self._catch_up()
            found = [
                entry
                for source, entries in self._visible(caller)
                if source_id is None or source == source_id
                for entry in entries
                if (needle is None or needle in entry.text.casefold())
                and (since is None or entry.end >= since)
                and (until is None or entry.start <= until)
            ]
        found.sort(key=lambda entry: (entry.start, entry.added_at))
        return found[-limit:]

    def sources(self, caller: Owner = ANONYMOUS) -> list[SourceStats]:
        with self._lock:
            self._catch_up()
            visible = [(owner, source, list(entries)) for owner, source, entries in self._visible_keys(caller)]
        return sorted((_source_stats(*item) for item in visible), key=lambda s: (s.source_id, s.owner))

    def stats(self, caller: Owner = ANONYMOUS) -> StoreStats:
        per_source = self.sources(caller)
        counted = [s for s in per_source if s.entries]
        return StoreStats(
            sources=len(per_source),
            entries=sum(s.entries for s in per_source),
            duration_s=sum(s.duration_s for s in per_source),
            first_start=min((s.first_start for s in counted if s.first_start is not None), default=None),
            last_end=max((s.last_end for s in counted if s.last_end is not None), default=None),
            skipped_lines=sum(self._skipped.get((s.owner, s.source_id), 0) for s in per_source),
            per_source=per_source,
        )

    def _visible(self, caller: Owner) -> Iterator[tuple[str, list[TranscriptEntry]]]:
        return ((source, entries) for _, source, entries in self._visible_keys(caller))

    def _visible_keys(self, caller: Owner) -> Iterator[tuple[str, str, list[TranscriptEntry]]]:
        """Only the caller's own sources are visited (every key's for the admin scope)."""
        owners = self._entries.items() if caller.admin else [(caller.name, self._entries.get(caller.name, {}))]
        return ((owner, source, entries) for owner, sources in owners for source, entries in sources.items())

    # ----- loading --------------------------------------------------------------------

    def _catch_up(self) -> None:
        """The sources other processes on the directory added since (a stat when none)."""
        self._load_files(self._index.merge())

    def _load_files(self, files: dict[str, SourceKey]) -> None:
        for name, (owner, source) in files.items():
            self._entries.setdefault(owner, {}).setdefault(source, [])
            self._load(name, owner, source)

    def _load(self, name: str, owner: str, source_id: str) -> None:
        path = self.directory / name
        if not path.exists():  # named in the sidecar, not yet written to
            return
        data = path.read_bytes()
        self._count_bytes(name, len(data))
        if data and not data.endswith(b"\n"):
            self._unterminated.add(name)
        entries = self._entries[owner][source_id]
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entries.append(_parse(line, source_id, owner))
            except ValueError as exc:  # pydantic's ValidationError is one too
                self._skipped[owner, source_id] = self._skipped.get((owner, source_id), 0) + 1
                log.warning("skipping unreadable transcript line %s:%d (%s)", path, number, str(exc).splitlines()[0])

    def _count_bytes(self, name: str, size: int) -> None:
        self.total_bytes += size - self._bytes.get(name, 0)
        self._bytes[name] = size


def _entry(source_id: str, owner: str, text: str, start: float, end: float, speaker: str | None) -> TranscriptEntry:
    try:
        return TranscriptEntry(source_id=source_id, owner=owner, text=text, start=start, end=end, speaker=speaker)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{param + ': ' if param else ''}{message}", param=param) from None


def _parse(line: str, source_id: str, owner: str) -> TranscriptEntry:
    """A stored line: the entry without its source id and owner, which the sidecar holds."""
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    return TranscriptEntry.model_validate({**fields, "source_id": source_id, "owner": owner})


def _source_stats(owner: str, source_id: str, entries: list[TranscriptEntry]) -> SourceStats:
    return SourceStats(
        source_id=source_id,
        owner=owner,
        entries=len(entries),
        duration_s=sum(entry.end - entry.start for entry in entries),
        first_start=min((entry.start for entry in entries), default=None),
        last_end=max((entry.end for entry in entries), default=None),
        speakers=sorted({entry.speaker for entry in entries if entry.speaker}),
    )
