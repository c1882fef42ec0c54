"""Incremental detokenization for Hugging Face tokenizers (the prefix/read-offset method):
text is released only once the tokens decode to whole characters, and a word piece that
changes how the previous piece decodes (leading spaces, byte fallback) is handled by
decoding a small window rather than each token alone."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt: list[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt[-6:])  # a little context, so the first piece decodes as in the text
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token: int) -> str:
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))
