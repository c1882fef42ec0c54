"""Engine-independent pieces of turning tokens into streamed text.

`Utf8Stream` holds back the bytes of a character split across tokens. `StopMatcher`
holds back text that might be the start of a stop sequence, so a stop sequence never
leaks into the output, even when it arrives split across tokens.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


class Utf8Stream:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass
class StopMatcher:
    stops: tuple[str, ...]
    _held: str = field(default="", init=False)

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop sequence was found). After a stop, the
        text from the stop sequence on is dropped."""
        if not self.stops:
            return text, False
        buffer = self._held + text
        cut = min((i for i in (buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buffer[:cut], True
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, once generation ended without a stop."""
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that is the beginning of some stop sequence."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best
