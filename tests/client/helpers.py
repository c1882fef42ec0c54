"""Small test utilities of the SDK tests: vector similarity, word lists, a real PNG."""

from __future__ import annotations

import math
import re
import struct
import zlib


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def tiny_png() -> bytes:
    """A real 1×1 PNG, made here (no image files in the repository)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + \
        chunk(b"IEND", b"")  # fmt: skip
