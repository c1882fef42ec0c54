"""How close a transcript is to what was said: word error rate for English (digits and
number words alike), character error rate for Japanese (punctuation and spaces dropped)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped, "two" and "2" alike."""
    found = re.sub(r"[^a-z0-9' ]", " ", unicodedata.normalize("NFKC", text).lower()).split()
    return [NUMBER_WORDS.get(word, word) for word in found]


def characters(text: str) -> str:
    """Letters and digits only: NFKC (full-width digits become ASCII), no punctuation or spaces."""
    return "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c)[0] in "LN")


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    distance = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, start=1):
        previous, distance[0] = distance[0], i
        for j, h in enumerate(hypothesis, start=1):
            previous, distance[j] = distance[j], min(distance[j] + 1, distance[j - 1] + 1, previous + (r != h))
    return distance[len(hypothesis)]


def error_rate(reference: Sequence[str], hypothesis: Sequence[str]) -> float:
    return edit_distance(reference, hypothesis) / max(1, len(reference))


def word_error_rate(reference: str, hypothesis: str) -> float:
    return error_rate(words(reference), words(hypothesis))


def character_error_rate(reference: str, hypothesis: str) -> float:
    return error_rate(characters(reference), characters(hypothesis))
