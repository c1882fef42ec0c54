"""Time as the runtime sees it; tests pass a clock they move by hand (no sleeps)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


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


async def within(waiting: Awaitable[T], seconds: float) -> T:
    """`waiting`, or asyncio.TimeoutError after `seconds`. Python 3.11's `wait_for` wraps the
    wait in a new task (measured: most of the body-limit middleware's cost per request); its
    `timeout()` only arms a timer."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await waiting
    return await asyncio.wait_for(waiting, seconds)
