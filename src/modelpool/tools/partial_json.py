"""Following JSON text while it is still being written.

A tool-call parser must know, before a call object is complete, where the value of its
`name` key ends (to announce the call) and where its arguments' value starts (to stream
it). `ValueScanner` follows one object or array as its text grows, tracking strings,
escapes and nesting, and records where each top-level member's value starts and ends. It
is not a validator (the parsers `json.loads` what they keep): it gives up only on
structure it cannot follow, so that a broken call is noticed as early as possible.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

SPACE = " \t\n\r"
"""JSON's whitespace."""

_OPENER = {"}": "{", "]": "["}
_STRING_STOP = re.compile(r'["\\]')
_NESTING = re.compile(r'[{}\[\]"]')
_SCALAR_END = frozenset(SPACE + ",}]")

# What comes next among the top-level members of an object.
_KEY, _COLON, _VALUE, _COMMA = range(4)


def skip_space(text: str, pos: int, space: str = SPACE) -> int:
    """The first position at or after `pos` that is not in `space` (len(text) if none)."""
    while pos < len(text) and text[pos] in space:
        pos += 1
    return pos


@dataclass
class Member:
    """A top-level member of a scanned object: `text[value_start:value_end]` is its value,
    exactly as written (no surrounding whitespace)."""

    key: str
    value_start: int
    value_end: int | None = None
    """None while the value is still being written."""


class ValueScanner:
    """Scans the JSON object or array that starts at `start` of a text that grows: call
    `scan` with the whole text so far each time more arrives; it resumes where it stopped."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.pos = start
        """How far the text has been scanned."""
        self.end: int | None = None
        """Just past the closing bracket, once it is written."""
        self.failed_at: int | None = None
        """Where the text stopped being a JSON object or array we can follow."""
        self.members: list[Member] = []
        """The top-level members whose value has started (objects only), in written order."""
        self._stack: list[str] = []
        self._in_string = False
        self._escaped = False
        self._in_scalar = False
        """Inside a number, true, false or null that is a member's value: it ends only at
        the next delimiter, so until then nobody knows it is whole."""
        self._expect = _KEY
        self._key_start = start
        self._key = ""

    def scan(self, text: str) -> None:
        i = self.pos
        while i < len(text) and self.end is None and self.failed_at is None:
            if self._in_string:
                i = self._string(text, i)
                continue
            char = text[i]
            if self._in_scalar:
                if char not in _SCALAR_END:
                    i += 1
                    continue
                self._in_scalar = False
                self._close_member(i)
            if not self._stack:
                if char in "{[":
                    self._stack.append(char)
                else:
                    self.failed_at = i
            elif self._stack == ["{"]:
                self._member_structure(text, i, char)
            else:
                # Inside a member's value or an array: only strings and nesting matter.
                found = _NESTING.search(text, i)
                if found is None:
                    i = len(text)
                    continue
                i = found.start()
                char = text[i]
                if char == '"':
                    self._in_string = True
                elif char in "{[":
                    self._stack.append(char)
                else:
                    self._close(char, i)
            i += 1
        self.pos = i if self.failed_at is None else self.failed_at

    def _string(self, text: str, i: int) -> int:
        """Moves through a string; the position to go on from."""
        if self._escaped:
            self._escaped = False
            return i + 1
        found = _STRING_STOP.search(text, i)
        if found is None:
            return len(text)
        i = found.start()
        if text[i] == "\\":
            self._escaped = True
            return i + 1
        self._in_string = False
        if self._stack == ["{"]:
            if self._expect == _KEY:
                try:
                    self._key = json.loads(text[self._key_start : i + 1])
                except ValueError:
                    self.failed_at = i
                self._expect = _COLON
            else:
                self._close_member(i + 1)
        return i + 1

    def _member_structure(self, text: str, i: int, char: str) -> None:
        """A character between the top-level members of an object."""
        if char in SPACE:
            return
        if self._expect == _KEY and char == '"':
            self._in_string = True
            self._key_start = i
        elif self._expect == _COLON and char == ":":
            self._expect = _VALUE
        elif self._expect == _VALUE and char not in ",:}]":
            self.members.append(Member(self._key, i))
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._stack.append(char)
            else:
                self._in_scalar = True
        elif self._expect == _COMMA and char == ",":
            self._expect = _KEY
        elif self._expect in (_KEY, _COMMA) and char == "}":
            # _KEY: `{}`, or a trailing comma (json.loads judges that, where it matters).
            self._close(char, i)
        else:
            self.failed_at = i

    def _close(self, char: str, i: int) -> None:
        if self._stack[-1] != _OPENER[char]:
            self.failed_at = i
            return
        self._stack.pop()
        if not self._stack:
            self.end = i + 1
        elif self._stack == ["{"]:
            self._close_member(i + 1)

    def _close_member(self, end: int) -> None:
        self.members[-1].value_end = end
        self._expect = _COMMA
