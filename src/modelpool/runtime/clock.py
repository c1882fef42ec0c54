"""Time as the runtime sees it; tests pass a clock they move by hand (no sleeps)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for measuring intervals and deadlines."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for reporting."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()
