"""The parts of one batch request stand or fall together (structured concurrency).

`asyncio.gather` leaves the other parts running when one fails: a batch answered with a
400 went on generating for a request that no longer existed, outside its turn. Here the
first failure, or the caller's cancellation (a client that left), cancels every sibling,
and nothing is raised or returned before they have all stopped. (`asyncio.TaskGroup` does
this from Python 3.11; this works on 3.10 too, and raises the failure itself rather than
an ExceptionGroup, so a bad part's 4xx stays a 4xx.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def all_or_none(parts: Iterable[Awaitable[T]]) -> list[T]:
    """Every part's result, in order; or the first failure (by position, among those that
    failed first), once every other part has been cancelled and has stopped."""
    tasks = [asyncio.ensure_future(part) for part in parts]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # a failure, or this caller's cancellation: the siblings go too
        errors = await _stop(tasks)
    first = next((errors[i] for i, task in enumerate(tasks) if task in done and i in errors), None)
    if first is not None:
        raise first
    return [task.result() for task in tasks]


async def _stop(tasks: list[asyncio.Task[T]]) -> dict[int, BaseException]:
    """Cancel what still runs and wait until it has stopped (a generation's stream closed,
    its engine sequence told to leave). Returns each failed part's error by position (all
    of them read, so none is reported as never retrieved)."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    errors = {i: task.exception() for i, task in enumerate(tasks) if not task.cancelled()}
    return {i: error for i, error in errors.items() if error is not None}
