"""Partial transcripts that never take anything back: the growing utterance is transcribed
again and again, and a word is sent (as a delta) only once two transcriptions in a row agree
on it and on everything before it ("local agreement", as in whisper_streaming). The last
word of a partial is often a cut-off word; agreement holds it back until it settles."""

from __future__ import annotations

import re

_NOT_WORD = re.compile(r"[^\w']+")


def _key(word: str) -> str:
    return _NOT_WORD.sub("", word.lower())


class LocalAgreement:
    def __init__(self) -> None:
        self._previous: list[str] = []
        self._sent: list[str] = []

    @property
    def sent(self) -> str:
        return " ".join(self._sent)

    def partial(self, text: str) -> str:
        """The delta this partial transcript settles ("" when none)."""
        words = text.split()
        agreed = _common_prefix(self._previous, words)
        self._previous = words
        return self._extend(words[:agreed])

    def final(self, text: str) -> str:
        """The rest of the utterance's final transcript, when it goes on from what was
        sent ("" when it took another turn: the completed event still has it all)."""
        return self._extend(text.split())

    def _extend(self, words: list[str]) -> str:
        if len(words) <= len(self._sent) or _common_prefix(self._sent, words) < len(self._sent):
            return ""
        new = words[len(self._sent) :]
        delta = (" " if self._sent else "") + " ".join(new)
        self._sent = words
        return delta


def _common_prefix(a: list[str], b: list[str]) -> int:
    count = 0
    for left, right in zip(a, b, strict=False):  # prefixes of different lengths: stop at the shorter
        if _key(left) != _key(right):
            break
        count += 1
    return count
