"""`TokenizerBackend` on a Hugging Face tokenizer: the pieces the transformers, CTranslate2
and sentence-transformers backends share. Blocking calls: run them on the backend's
tokenizer thread (a tokenizer is not thread-safe)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from modelpool.backends.textgen.decoding import check_token_ids
from modelpool.inference import TokenPiece

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
"""SentencePiece's spelling of a raw byte (`<0xC3>`), used where no piece covers a character."""


def encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Special tokens written out, as vLLM's /detokenize does (the tokenizer's own defaults)."""
    check_token_ids(ids, len(tokenizer), "tokens")
    return str(tokenizer.decode(ids))


def pieces(tokenizer: Any, ids: list[int]) -> list[TokenPiece]:
    spellings: list[str] = tokenizer.convert_ids_to_tokens(ids)
    kind = _decoder_kind(tokenizer)
    if kind == "WordPiece":
        return [TokenPiece(token, _wordpiece_bytes(spelling, index), spelling)
                for index, (token, spelling) in enumerate(zip(ids, spellings, strict=True))]  # fmt: skip
    return [
        TokenPiece(token, _piece_bytes(tokenizer, token, spelling, kind == "ByteLevel"), spelling)
        for token, spelling in zip(ids, spellings, strict=True)
    ]


def _wordpiece_bytes(spelling: str, index: int) -> bytes:
    """WordPiece (BERT): `##ing` continues a word; any other token starts one, after a space
    unless it opens the text. (Decoding also drops the space before punctuation; the pieces
    keep it, as a word boundary is what the vocabulary says.)"""
    if spelling.startswith("##"):
        return spelling[2:].encode("utf-8")
    return (spelling if index == 0 else f" {spelling}").encode("utf-8")


def _piece_bytes(tokenizer: Any, token: int, spelling: str, byte_level: bool) -> bytes:
    """The bytes a token adds to decoded text. Decoding a token alone would turn part of a
    UTF-8 character into U+FFFD, so byte-level and byte-fallback spellings are mapped back
    to their bytes; any other token is decoded (WordPiece) or its `▁` read as a space."""
    fallback = _BYTE_FALLBACK.match(spelling)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    if byte_level:
        table = _gpt2_byte_decoder()
        if all(char in table for char in spelling):
            return bytes(table[char] for char in spelling)
    if "▁" in spelling:
        return spelling.replace("▁", " ").encode("utf-8")
    return str(tokenizer.decode([token])).encode("utf-8")


def _decoder_kind(tokenizer: Any) -> str:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__


@cache
def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: each byte is spelt as one printable character
    (printable Latin-1 as itself, the rest shifted past U+0100), so `Ġ` is a space."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}
