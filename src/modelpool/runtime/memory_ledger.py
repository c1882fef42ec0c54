"""Growth of one meter (the process's RSS, or the GPUs' used memory) shared out among the
measuring windows open while it grew, so that what is attributed adds up.

Measuring a load as "RSS after minus RSS before" counts everything that grew meanwhile:
four concurrent loads each counted the other three and the runtimes they imported (4 GB
"measured" in a 1.8 GB process). Here every window's open and close is an event; the
meter is read at each event, and the growth between two events is split among the windows
open then, in proportion to their weights (a load's estimated need). Each byte of growth
goes to one window at most, so the windows' sum never exceeds the meter's growth. A window
that absorbs (an unload, whose freed memory is not anyone's negative growth) takes every
change while it is open. Growth while nothing is open stays unattributed.

Not thread-safe: windows open and close on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class Window:
    weight: float
    absorbs: bool = False
    share: float = 0.0
    """Growth attributed so far (negative while the meter fell)."""


class Ledger:
    def __init__(self, meter: Callable[[], int]) -> None:
        self._meter = meter
        self.start = meter()
        """The baseline: the meter when the ledger was made, plus growth its owner credits to
        the process itself (`MemoryAccounts.side_imports`)."""
        self._last = self.start
        self._open: list[Window] = []
        self.unattributed = 0
        """Growth (or shrinking) while no window was open."""

    def read(self) -> int:
        """The meter now (not an event: nothing is attributed)."""
        return self._meter()

    def open(self, weight: float, *, absorbs: bool = False) -> Window:
        self._settle()
        window = Window(max(weight, 1.0), absorbs)
        self._open.append(window)
        return window

    def close(self, window: Window) -> int:
        """The bytes the window was attributed, never below 0; closing twice gives 0."""
        if window not in self._open:
            return 0
        self._settle()
        self._open.remove(window)
        return max(0, int(window.share))

    def _settle(self) -> None:
        now = self._meter()
        change, self._last = now - self._last, now
        if change == 0:
            return
        takers = [w for w in self._open if w.absorbs] or self._open
        if not takers:
            self.unattributed += change
            return
        total = sum(w.weight for w in takers)
        for window in takers:
            window.share += change * window.weight / total
