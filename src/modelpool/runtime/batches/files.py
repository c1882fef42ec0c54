"""Uploaded files and batch outputs: bytes on disk under random ids (a client never names a
path), records in SQLite, mirrored in memory so a read never waits on the disk.

An upload is copied to disk off the event loop, bounded as it goes (size, lines, line
length, the key's quota), and a `batch` file is checked line by line: each line one JSON
object, or a 400 naming the line. Deeper checks (each line a request the endpoint takes)
happen when a batch is made of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import IO, TypeVar

from modelpool.config.schema import BatchApiConfig
from modelpool.errors import BatchApiUnavailable, InvalidRequest, ObjectNotFound, RequestTooLarge, StoreFull
from modelpool.owner import Owner
from modelpool.pool_api.batches import FileRecord, Order, Page
from modelpool.runtime.batches.database import Database

UPLOAD_PURPOSES = ("batch",)
"""What `/v1/files` takes: a batch's input. OpenAI's other purposes (fine-tune, assistants,
vision, user_data) serve APIs modelpool does not have, so they are refused, not stored."""
_CHUNK = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class FileLimits:
    max_bytes: int
    max_lines: int
    max_line_bytes: int
    key_bytes: int
    key_files: int

    @classmethod
    def of(cls, config: BatchApiConfig) -> FileLimits:
        return cls(config.max_file_bytes, config.max_lines, config.max_line_bytes,
                   config.key_storage_bytes, config.key_files)  # fmt: skip


class FileStore:
    """A `FileStorage`."""

    def __init__(self, db: Database, root: Path, limits: FileLimits) -> None:
        self.db = db
        self.root = root
        self.limits = limits
        root.mkdir(parents=True, exist_ok=True)
        rows = db.now(lambda c: c.execute("SELECT * FROM files ORDER BY created_at, rowid").fetchall())
        self._files = {row[0]: FileRecord(*row) for row in rows}
        self.off: str | None = None
        """Why this server does not serve the files (another server holds the directory)."""
        self.held: Callable[[str], int] = lambda owner: 0
        """Bytes of finished lines a key's unfinished batches hold, their files to be (set by
        the batch runner): they count against the key's quota like its files."""

    async def add(self, owner: Owner, filename: str, purpose: str, source: IO[bytes]) -> FileRecord:
        """Store an upload of `purpose` (`batch`) from `source`, checked as it is copied."""
        self.check_on()
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequest(
                f"Invalid purpose '{purpose}': this server stores files for 'batch' only.", param="purpose"
            )
        self._check_quota(owner.name, 0)
        file_id = new_id("file")
        lines = await asyncio.to_thread(self._copy, source, self.path_of(file_id))
        record = FileRecord(file_id, owner.name, filename[:255], purpose, self.path_of(file_id).stat().st_size,
                            int(time.time()), lines)  # fmt: skip
        try:
            self._check_quota(owner.name, record.bytes)
        except StoreFull:
            self.path_of(file_id).unlink(missing_ok=True)
            raise
        # Counted at once, with no await since the check: uploads ending together cannot all
        # pass the quota one of them fills.
        self.remember(record)
        try:
            await self.db.run(lambda c: insert_file(c, record))
        except BaseException:
            self._files.pop(file_id, None)
            self.path_of(file_id).unlink(missing_ok=True)
            raise
        return record

    def room(self, owner: str) -> int:
        """Bytes the key may still store: its quota less its files and what its batches hold."""
        return self.limits.key_bytes - self._used(owner) - self.held(owner)

    def remember(self, record: FileRecord) -> None:
        """A file whose row a caller's own transaction inserted (`insert_file`)."""
        self._files[record.id] = record

    def get(self, file_id: str, caller: Owner) -> FileRecord:
        self.check_on()
        found = self._files.get(file_id)
        if found is None or not caller.sees(found.owner):
            raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")
        return found

    def path(self, record: FileRecord) -> Path:
        return self.path_of(record.id)

    def path_of(self, file_id: str) -> Path:
        return self.root / file_id  # ids are ours (`new_id`): never a client's path

    def list(self, caller: Owner, purpose: str | None, limit: int, after: str | None, order: Order) -> Page:
        self.check_on()
        mine = [f for f in self._files.values() if caller.sees(f.owner) and purpose in (None, f.purpose)]
        return page(mine if order == "asc" else mine[::-1], limit, after, lambda f: f.id)

    async def delete(self, file_id: str, caller: Owner) -> FileRecord:
        record = self.get(file_id, caller)
        del self._files[file_id]
        await self.db.run(lambda c: c.execute("DELETE FROM files WHERE id = ?", (file_id,)))
        await asyncio.to_thread(self.path_of(file_id).unlink, True)
        return record

    def check_on(self) -> None:
        if self.off is not None:
            raise BatchApiUnavailable(f"The Batch and Files APIs are off on this server: {self.off}.")

    def _check_quota(self, owner: str, adding: int) -> None:
        theirs = [f for f in self._files.values() if f.owner == owner]
        if len(theirs) >= self.limits.key_files:
            raise StoreFull(f"This key keeps {len(theirs)} files, the most allowed (batch_api.key_files): "
                            "delete some first.")  # fmt: skip
        used = self._used(owner) + self.held(owner)
        if used + adding > self.limits.key_bytes:
            quota = self.limits.key_bytes
            raise StoreFull(f"This key's files (and its batches' outputs) would take {used + adding} bytes, "
                            f"more than its quota of {quota} (batch_api.key_storage_bytes): "
                            "delete some first.")  # fmt: skip

    def _used(self, owner: str) -> int:
        return sum(f.bytes for f in self._files.values() if f.owner == owner)

    def _copy(self, source: IO[bytes], target: Path) -> int:
        """Copy `source` to `target`, checking its size and each line; the lines it holds."""
        checker = _LineChecker(self.limits)
        written = 0
        try:
            with open(target, "wb") as out:
                while chunk := source.read(_CHUNK):
                    written += len(chunk)
                    if written > self.limits.max_bytes:
                        raise RequestTooLarge(f"The file is larger than {self.limits.max_bytes} bytes "
                                              "(batch_api.max_file_bytes).", param="file")  # fmt: skip
                    checker.feed(chunk)
                    out.write(chunk)
                checker.end()
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return checker.lines


class _LineChecker:
    """Each line of a JSONL upload: within the line bound, one JSON object; at most
    `max_lines` of them, at least one."""

    def __init__(self, limits: FileLimits) -> None:
        self.limits = limits
        self.lines = 0
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        for line in whole:
            self._check(line)
        if len(self._partial) > self.limits.max_line_bytes:
            self._too_long(self.lines + 1)

    def end(self) -> None:
        if self._partial.strip():
            self._check(self._partial)
        if self.lines == 0:
            raise InvalidRequest("The file holds no requests: a batch file has one JSON object a line.", param="file")

    def _check(self, line: bytes) -> None:
        if not line.strip():
            return  # blank lines (a trailing newline, a CRLF file's last line) are no request
        self.lines += 1
        if len(line) > self.limits.max_line_bytes:
            self._too_long(self.lines)
        if self.lines > self.limits.max_lines:
            raise InvalidRequest(f"The file has more than {self.limits.max_lines} requests (batch_api.max_lines).",
                                 param="file")  # fmt: skip
        try:
            parsed = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"Line {self.lines} is not valid JSON: {exc}.", param="file") from None
        except RecursionError:  # `[[[[...` deeper than the parser goes
            raise InvalidRequest(f"Line {self.lines} nests its JSON too deeply.", param="file") from None
        if not isinstance(parsed, dict):
            raise InvalidRequest(f"Line {self.lines} is not a JSON object.", param="file")

    def _too_long(self, number: int) -> None:
        raise InvalidRequest(f"Line {number} is longer than {self.limits.max_line_bytes} bytes "
                             "(batch_api.max_line_bytes).", param="file")  # fmt: skip


def insert_file(db: sqlite3.Connection, record: FileRecord) -> None:
    db.execute("INSERT INTO files VALUES (?,?,?,?,?,?,?)", astuple(record))


def new_id(prefix: str) -> str:
    """A random id (`file-...`, `batch_...`): unguessable, and never a path."""
    return f"{prefix}-{secrets.token_hex(12)}" if prefix == "file" else f"{prefix}_{secrets.token_hex(12)}"


def page(items: Sequence[T], limit: int, after: str | None, key: Callable[[T], str]) -> Page:
    """`limit` items after the one whose id is `after` (from the start when None or unknown)."""
    start = 0
    if after is not None:
        ids = [key(item) for item in items]
        start = ids.index(after) + 1 if after in ids else len(items)
    chosen = items[start : start + limit]
    return Page(list(chosen), start + limit < len(items))
