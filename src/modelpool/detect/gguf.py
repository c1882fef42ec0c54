"""A bounded reader of a GGUF file's header: the magic, the version, the tensor and
key/value counts and the metadata key/values — never the tensors.

The reader works on the first bytes of the file, which is all detection may look at (a
hub repo gives them through a ranged GET). Every length and count in the file is checked
against the bytes that are really there before anything is allocated, so a hostile or
truncated file costs at most the bytes read, never what its header claims. Only scalar
values and short strings are kept; long strings (the chat template) and arrays (the
vocabulary) are stepped over and remembered by their size.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from modelpool.errors import ModelSourceError

MAGIC = b"GGUF"
MAX_KV_COUNT = 100_000
"""More metadata entries than any real model has (they carry a few dozen)."""
MAX_KEY_BYTES = 1024
MAX_KEPT_STRING_BYTES = 4096
"""Strings up to this size are kept as values; longer ones (a chat template) only as present."""

_STRING, _ARRAY = 8, 9
_SCALARS: Mapping[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
"""GGUF value type → struct format of one little-endian item."""

Scalar = str | int | float | bool


class NeedMoreBytes(Exception):
    """The header goes on past the bytes given: read a longer head and parse again."""


@dataclass(frozen=True)
class GgufHeader:
    version: int
    tensor_count: int
    values: Mapping[str, Scalar] = field(default_factory=dict)
    """Scalar values and strings of at most MAX_KEPT_STRING_BYTES, by key."""
    long_strings: Mapping[str, int] = field(default_factory=dict)
    """Strings too long to keep (a chat template): key → length in bytes."""
    arrays: Mapping[str, int] = field(default_factory=dict)
    """Array values: key → item count (the vocabulary, merges, ...)."""

    def has(self, key: str) -> bool:
        return key in self.values or key in self.long_strings or key in self.arrays

    def text(self, key: str) -> str | None:
        value = self.values.get(key)
        return value if isinstance(value, str) else None

    def number(self, key: str) -> int | None:
        value = self.values.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_header(data: bytes, *, complete: bool, label: str) -> GgufHeader:
    """The header in `data`, the first bytes of a GGUF file. `complete` says `data` is the
    whole file: running out of bytes then means a truncated file (ModelSourceError);
    otherwise it raises NeedMoreBytes. Anything malformed is a ModelSourceError naming `label`."""
    cursor = _Cursor(memoryview(data), complete=complete, label=label)
    if bytes(cursor.take(4)) != MAGIC:
        raise ModelSourceError(f"{label} is not a GGUF file (it does not start with 'GGUF')")
    version = cursor.scalar(4)
    if version not in (2, 3):
        raise ModelSourceError(f"{label}: GGUF version {version} is not supported (versions 2 and 3 are)")
    tensor_count, kv_count = cursor.scalar(10), cursor.scalar(10)
    if not isinstance(kv_count, int) or kv_count > MAX_KV_COUNT:
        raise ModelSourceError(f"{label}: GGUF header claims {kv_count} metadata entries (at most {MAX_KV_COUNT})")
    values: dict[str, Scalar] = {}
    long_strings: dict[str, int] = {}
    arrays: dict[str, int] = {}
    for _ in range(kv_count):
        key = cursor.string(MAX_KEY_BYTES, "a metadata key")
        kind = cursor.scalar(4)
        if kind == _ARRAY:
            arrays[key] = cursor.skip_array()
        elif kind == _STRING:
            _read_string_value(cursor, key, values, long_strings)
        elif isinstance(kind, int) and kind in _SCALARS:
            values[key] = cursor.scalar(kind)
        else:
            raise ModelSourceError(f"{label}: metadata '{key}' has an unknown GGUF value type {kind}")
    return GgufHeader(int(version), int(tensor_count), values, long_strings, arrays)


def _read_string_value(cursor: _Cursor, key: str, values: dict[str, Scalar], long_strings: dict[str, int]) -> None:
    length = cursor.length(1, f"the string '{key}'")
    if length <= MAX_KEPT_STRING_BYTES:
        values[key] = cursor.decode(cursor.take(length), key)
    else:
        cursor.take(length)
        long_strings[key] = length


class _Cursor:
    """Reads forward through the head; every length is checked against what is left."""

    def __init__(self, data: memoryview, *, complete: bool, label: str) -> None:
        self.data, self.pos, self.complete, self.label = data, 0, complete, label

    def take(self, size: int) -> memoryview:
        if self.pos + size > len(self.data):
            if self.complete:
                raise ModelSourceError(
                    f"{self.label}: the GGUF file is truncated (its header needs more than its {len(self.data)} bytes)"
                )
            raise NeedMoreBytes
        piece = self.data[self.pos : self.pos + size]
        self.pos += size
        return piece

    def scalar(self, kind: int) -> Scalar:
        fmt = _SCALARS[kind]
        value: Scalar = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def length(self, item_size: int, what: str) -> int:
        """A uint64 count of items of at least `item_size` bytes. A count the rest of the
        file cannot hold is refused at once when the file is complete (no allocation, no
        loop over a claimed billion items)."""
        count = int(self.scalar(10))
        room = (len(self.data) - self.pos) // max(item_size, 1)
        if count > room and (self.complete or count * item_size > 2**40):
            raise ModelSourceError(
                f"{self.label}: {what} claims {count} items of {item_size}+ bytes; the file holds only "
                f"{len(self.data) - self.pos} more bytes (truncated or corrupt)"
            )
        return count

    def string(self, limit: int, what: str) -> str:
        length = self.length(1, what)
        if length > limit:
            raise ModelSourceError(f"{self.label}: {what} is {length} bytes long (at most {limit})")
        return self.decode(self.take(length), what)

    def skip_array(self) -> int:
        kind = self.scalar(4)
        if kind == _STRING:
            count = self.length(8, "an array of strings")
            for _ in range(count):
                self.take(self.length(1, "a string in an array"))
            return count
        if kind == _ARRAY:
            raise ModelSourceError(f"{self.label}: nested GGUF arrays are not read")
        if not isinstance(kind, int) or kind not in _SCALARS:
            raise ModelSourceError(f"{self.label}: an array has an unknown GGUF value type {kind}")
        size = struct.calcsize(_SCALARS[kind])
        count = self.length(size, "an array")
        self.take(count * size)
        return count

    def decode(self, raw: memoryview, what: str) -> str:
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ModelSourceError(f"{self.label}: {what} is not UTF-8") from None
