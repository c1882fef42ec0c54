"""Waiting for a state that other tasks bring about: poll with a deadline, never a fixed
sleep before asserting. A condition that never comes fails with what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], bool], what: str, *, timeout_s: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not condition():
                await asyncio.sleep(0.01)  # yields to the tasks that change the state
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}") from None


async def until_answered(condition: Callable[[], Awaitable[bool]], what: str, *, timeout_s: float = 10.0) -> None:
    """As `until`, for a condition that must be asked for (an engine thread answers it)."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}") from None


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """As `until`, from synchronous code (a thread of its own, or a sync test driving a
    server in other processes): polls `condition` until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)  # the state changes elsewhere: poll, with the deadline above
