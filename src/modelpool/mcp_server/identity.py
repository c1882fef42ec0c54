"""Which file holds which source: file names made from raw source ids, and the identity
sidecar (`sources.json`) that maps each file back to the raw id it holds.

A file name is the source id sanitised for any filesystem (`room/1` → `room_1.jsonl`), so
two ids can sanitise alike (`room/1`, `room:1`). The second gets its own file
(`room_1-2.jsonl`), and only the sidecar says whose each file is: raw ids never have to be
recovered from file names. Names are compared case-insensitively, as macOS and Windows
filesystems compare them.

The sidecar also names the API key each source belongs to (`owners`, by file; absent: the
anonymous owner of a server without keys, as every source of a version-1 sidecar). The
same source id under two keys is two sources, in two files.

A new source is not written into the sidecar (that would rewrite every other source's
line): it is appended to the journal (`.sources.journal`, one JSON line a source), which
`source_index.py` folds into the sidecar now and then. The mapping is the sidecar's
entries and then the journal's, and a file name, once given, is never given again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG

from modelpool.errors import ConfigError

log = logging.getLogger("modelpool.transcripts")
SIDECAR = "sources.json"
JOURNAL = ".sources.journal"
SUFFIX = ".jsonl"
SourceKey = tuple[str, str]
"""(owner, source id): a source as the store tells them apart."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_STEM_MAX = 64


_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)
"""Names Windows reserves for devices, whatever the extension (`con.jsonl` is the console)."""


def file_stem(source_id: str) -> str:
    """A name that is safe on every filesystem: no separators, no dots (so no `..`, no
    hidden files), no device name, bounded length."""
    stem = _UNSAFE.sub("_", source_id).strip("_")[:_STEM_MAX] or "source"
    return f"{stem}_" if stem.casefold() in _DEVICE_NAMES else stem


def unused_name(source_id: str, taken: Callable[[str], bool]) -> str:
    """The sanitised file name for `source_id`, numbered past every name `taken` says is."""
    stem = file_stem(source_id)
    name, number = f"{stem}{SUFFIX}", 1
    while taken(name):
        number += 1
        name = f"{stem}-{number}{SUFFIX}"
    return name


def read_sidecar(directory: Path) -> dict[str, SourceKey]:
    """File name → (owner, raw source id). A sidecar that cannot be read stops the store:
    guessing ids from file names would attribute transcripts to the wrong source, and
    writing a new sidecar over it would lose the mapping for good."""
    path = directory / SIDECAR
    if not path.exists():
        return {}
    try:
        sidecar = json.loads(path.read_text(encoding="utf-8"))
        files, owners = sidecar["files"], sidecar.get("owners", {})
        if not _maps_strings(files) or not _maps_strings(owners):
            raise TypeError("`files` and `owners` must map file names to strings")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the transcript store's identity file {path} is unreadable ({exc}); "
                          "repair it or move the transcript directory aside") from None  # fmt: skip
    return {str(name): (owners.get(name, ""), source) for name, source in files.items() if _is_own_name(str(name))}


def write_sidecar(directory: Path, files: dict[str, SourceKey]) -> None:
    """Written whole to a temporary file, flushed to the disk, and renamed over the old one
    (the directory flushed after), so a crash leaves the old mapping or the new one, never
    half of one nor an empty file. Callers hold the store's lock: the name is fixed."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{SIDECAR}.tmp"
    owners = {name: owner for name, (owner, _) in files.items() if owner}
    sidecar = {"version": 2, "files": {name: source for name, (_, source) in files.items()}, "owners": owners}
    with temporary.open("w", encoding="utf-8") as out:
        out.write(json.dumps(sidecar, indent=1, ensure_ascii=False))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, directory / SIDECAR)
    _fsync_directory(directory)


def append_journal(directory: Path, name: str, key: SourceKey) -> int:
    """Record a new source: one line, on the disk (fsync) before the source's file is
    first written. Returns the journal's size after it. Callers hold the store's lock."""
    path = directory / JOURNAL
    created = not path.exists()
    line = json.dumps({"file": name, "owner": key[0], "source": key[1]}, ensure_ascii=False) + "\n"
    with path.open("a+b") as out:
        end = out.seek(0, os.SEEK_END)
        if end and os.pread(out.fileno(), 1, end - 1) != b"\n":  # a line a crash cut short stays alone
            out.write(b"\n")
        out.write(line.encode())
        out.flush()
        os.fsync(out.fileno())
        size = out.tell()
    if created:
        _fsync_directory(directory)
    return size


def read_journal(directory: Path, offset: int) -> tuple[dict[str, SourceKey], int]:
    """The sources journalled from byte `offset` on, and the offset past the last whole line
    (a line still being written, or cut short by a crash, is not taken)."""
    try:
        with (directory / JOURNAL).open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return {}, offset
    whole = data[: data.rfind(b"\n") + 1]
    found: dict[str, SourceKey] = {}
    for line in whole.splitlines():
        entry = _journal_entry(line)
        if entry is not None:
            found.setdefault(*entry)
    return found, offset + len(whole)


def journal_size(directory: Path) -> int:
    """0 when there is none (or something that is not a file is in its place)."""
    try:
        stat = (directory / JOURNAL).stat()
    except FileNotFoundError:
        return 0
    return stat.st_size if S_ISREG(stat.st_mode) else 0


def _journal_entry(line: bytes) -> tuple[str, SourceKey] | None:
    if not line.strip():
        return None
    try:
        fields = json.loads(line)
        name, owner, source = fields["file"], fields["owner"], fields["source"]
        if not all(isinstance(value, str) for value in (name, owner, source)) or not _is_own_name(name):
            raise TypeError("not a file name and two strings")
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("skipping an unreadable line of the transcript store's journal (%s)", exc)
        return None
    return name, (owner, source)


def _fsync_directory(directory: Path) -> None:
    """The rename itself reaches the disk only when the directory is flushed."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _maps_strings(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _is_own_name(name: str) -> bool:
    """Only plain names this module could have made: a hand-edited sidecar must not point
    the store at files outside its directory."""
    return name.endswith(SUFFIX) and "/" not in name and "\\" not in name and not name.startswith(".")
