"""GGUF headers written by hand, byte by byte, so tests can make any header: a valid one,
a truncated one, one that lies about its sizes."""

from __future__ import annotations

import struct
from collections.abc import Sequence

STRING, ARRAY, UINT32, BOOL = 8, 9, 4, 7


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", UINT32, value)


def kv_string_array(key: str, items: Sequence[str]) -> bytes:
    body = b"".join(gguf_string(item) for item in items)
    return gguf_string(key) + struct.pack("<IIQ", ARRAY, STRING, len(items)) + body


def header(kvs: Sequence[bytes], *, version: int = 3, tensors: int = 0, kv_count: int | None = None) -> bytes:
    count = len(kvs) if kv_count is None else kv_count
    return b"GGUF" + struct.pack("<IQQ", version, tensors, count) + b"".join(kvs)


def llm_header(arch: str = "llama", *, template: bool = True, context: int = 8192, file_type: int = 15) -> bytes:
    kvs = [
        kv_string("general.architecture", arch),
        kv_string("general.name", "Tiny Test"),
        kv_u32(f"{arch}.context_length", context),
        kv_u32("general.file_type", file_type),
        kv_string_array("tokenizer.ggml.tokens", ["a", "b", "c"]),
    ]
    if template:
        kvs.append(kv_string("tokenizer.chat_template", "{{ messages }}" * 1000))
    return header(kvs)
