"""The transcript store: what was said, by which source, when.

Persisted as one JSONL file per source (one entry a line, appended) under a directory, with
the identity sidecar of `identity.py` naming the raw source id of each file. Everything is
also held in memory, loaded once when the store is made, so queries never touch the disk.
A line that cannot be read (a crash cut it short, a hand edit broke it) is skipped, logged
and counted in the stats; the entries around it still load.

Times (`start`, `end`) are seconds on whatever clock the source uses (Unix time for a live
stream, offsets into a recording); the store only compares them. One process writes a
store directory at a time.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from modelpool.errors import InvalidRequest, StoreUnavailable
from modelpool.inference import Segment
from modelpool.mcp_server import identity

log = logging.getLogger("modelpool.transcripts")
MAX_LIMIT = 10_000
MAX_TEXT = 65_536
"""Characters of one entry (an utterance; a longer text is a document, not a transcript line)."""


class TranscriptEntry(BaseModel):
    """One utterance of one source."""

    model_config = ConfigDict(frozen=True)

    source_id: str = Field(min_length=1, max_length=256)
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    start: float
    """Seconds on the source's clock."""
    end: float
    speaker: str | None = None
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
    """Thread-safe: every read and write holds one lock (writes are single small appends)."""

    def __init__(self, directory: Path) -> None:
        """Loads what `directory` holds (it need not exist: it is made on the first write)."""
        self.directory = directory
        self._lock = threading.Lock()
        self._files = identity.read_sidecar(directory)
        self._entries: dict[str, list[TranscriptEntry]] = {source: [] for source in self._files.values()}
        self._unterminated: set[str] = set()
        self.skipped_lines = 0
        for name, source in self._files.items():
            self._load(name, source)

    # ----- writing --------------------------------------------------------------------

    def add(self, source_id: str, text: str, start: float, end: float, speaker: str | None = None) -> TranscriptEntry:
        (entry,) = self.add_many(source_id, [(text, start, end, speaker)])
        return entry

    def add_segments(self, source_id: str, segments: Iterable[Segment], offset: float = 0.0) -> list[TranscriptEntry]:
        """A transcription's segments (blank ones skipped), their times shifted by `offset`."""
        timed = [(s.text.strip(), s.start + offset, s.end + offset, None) for s in segments]
        return self.add_many(source_id, [item for item in timed if item[0]])

    def add_many(self, source_id: str, items: Iterable[tuple[str, float, float, str | None]]) -> list[TranscriptEntry]:
        """Check every item, then append them all (nothing is written if one is invalid)."""
        entries = [_entry(source_id, text, start, end, speaker) for text, start, end, speaker in items]
        if not entries:
            return []
        with self._lock:
            try:
                name = self._file_of(source_id)
                lines = "".join(entry.model_dump_json(exclude={"source_id"}) + "\n" for entry in entries)
                with (self.directory / name).open("a", encoding="utf-8") as out:
                    if name in self._unterminated:  # a cut-off last line must not swallow the next entry
                        out.write("\n")
                        self._unterminated.discard(name)
                    out.write(lines)
            except OSError as exc:  # a full disk, a read-only directory: the store's fault, not the caller's
                log.error("the transcript store cannot write to %s: %s", self.directory, exc)
                raise StoreUnavailable(f"the transcript store cannot be written ({exc.strerror})") from None
            self._entries.setdefault(source_id, []).extend(entries)
        return entries

    def _file_of(self, source_id: str) -> str:
        """The source's file, naming (and recording) a new one for a new source. The sidecar
        is written before the file is first appended to, so no file is ever anonymous."""
        for name, source in self._files.items():
            if source == source_id:
                return name
        on_disk = {path.name.casefold() for path in self.directory.glob("*")} if self.directory.exists() else set()
        name = identity.unused_name(source_id, on_disk | {known.casefold() for known in self._files})
        identity.write_sidecar(self.directory, {**self._files, name: source_id})
        self._files[name] = source_id
        return name

    # ----- reading --------------------------------------------------------------------

    def query(
        self,
        source_id: str | None = None,
        text: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
    ) -> list[TranscriptEntry]:
        """Entries of one source (or all) whose text contains `text` (case-insensitive) and
        whose span overlaps [since, until]; the latest `limit` of them, oldest first."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}", param="limit")
        needle = text.casefold() if text else None
        with self._lock:
            pool = self._entries.get(source_id, []) if source_id is not None else _all(self._entries.values())
            found = [
                entry
                for entry in pool
                if (needle is None or needle in entry.text.casefold())
                and (since is None or entry.end >= since)
                and (until is None or entry.start <= until)
            ]
        found.sort(key=lambda entry: (entry.start, entry.added_at))
        return found[-limit:]

    def sources(self) -> list[SourceStats]:
        with self._lock:
            return [_source_stats(source, list(entries)) for source, entries in sorted(self._entries.items())]

    def stats(self) -> StoreStats:
        per_source = self.sources()
        counted = [s for s in per_source if s.entries]
        return StoreStats(
            sources=len(per_source),
            entries=sum(s.entries for s in per_source),
            duration_s=sum(s.duration_s for s in per_source),
            first_start=min((s.first_start for s in counted if s.first_start is not None), default=None),
            last_end=max((s.last_end for s in counted if s.last_end is not None), default=None),
            skipped_lines=self.skipped_lines,
            per_source=per_source,
        )

    # ----- loading --------------------------------------------------------------------

    def _load(self, name: str, source_id: str) -> None:
        path = self.directory / name
        if not path.exists():  # named in the sidecar, not yet written to
            return
        data = path.read_text(encoding="utf-8", errors="replace")
        if data and not data.endswith("\n"):
            self._unterminated.add(name)
        for number, line in enumerate(data.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                self._entries[source_id].append(_parse(line, source_id))
            except ValueError as exc:  # pydantic's ValidationError is one too
                self.skipped_lines += 1
                log.warning("skipping unreadable transcript line %s:%d (%s)", path, number, str(exc).splitlines()[0])


def _entry(source_id: str, text: str, start: float, end: float, speaker: str | None) -> TranscriptEntry:
    try:
        return TranscriptEntry(source_id=source_id, text=text, start=start, end=end, speaker=speaker)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(f"{param + ': ' if param else ''}{message}", param=param) from None


def _parse(line: str, source_id: str) -> TranscriptEntry:
    """A stored line: the entry without its source id, which the sidecar holds."""
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    return TranscriptEntry.model_validate({**fields, "source_id": source_id})


def _all(groups: Iterable[list[TranscriptEntry]]) -> list[TranscriptEntry]:
    return [entry for group in groups for entry in group]


def _source_stats(source_id: str, entries: list[TranscriptEntry]) -> SourceStats:
    return SourceStats(
        source_id=source_id,
        entries=len(entries),
        duration_s=sum(entry.end - entry.start for entry in entries),
        first_start=min((entry.start for entry in entries), default=None),
        last_end=max((entry.end for entry in entries), default=None),
        speakers=sorted({entry.speaker for entry in entries if entry.speaker}),
    )
