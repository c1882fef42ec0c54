"""Tasks for work that outlives the request that happened to start it.

asyncio copies the creating task's context variables into every task it starts. For a
request's own helpers that is what is wanted (their spans join its trace), but a
batcher's worker or a model's load serves every request that comes after: started from
the first one's context, it would keep that request's tracer and server span (parenting
its spans to a trace that ended long ago), its caller and its request id, and keep them
alive.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def detached_task(work: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """`work` as a task with an empty context: none of the caller's context variables."""
    loop = asyncio.get_running_loop()
    # create_task's `context=` is Python 3.11+; run in an empty context, it copies that one.
    return contextvars.Context().run(loop.create_task, work, name=name)
