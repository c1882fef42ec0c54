"""From an engine thread to the event loop, in runs.

An engine thread produces a request's tokens one at a time; waking the event loop for
each one (`call_soon_threadsafe`, a write to the loop's self-pipe, one loop iteration)
is what made a single llama.cpp stream run at 0.78x native. A `Channel` wakes the loop
only when no wakeup is pending: the first token crosses at once, and while the consumer
is busy (writing the previous chunk to a socket, serving other requests) the next ones
queue up and cross together, in one wakeup. The engine thread never waits on the
consumer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Generic, TypeVar

from modelpool.inference import GenerationChunk

T = TypeVar("T")


class _End:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Channel(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: deque[T | _End] = deque()
        self._wakeup_pending = False
        self._ready = asyncio.Event()
        self.cancelled = threading.Event()
        """Set when the consumer leaves; the producer checks it between steps."""

    # ----- the producer's side (any thread) ----------------------------------------------

    def put(self, item: T) -> None:
        self._push(item)

    def end(self, error: BaseException | None = None) -> None:
        """No more items; with `error`, the consumer raises it after the items before it."""
        self._push(_End(error))

    def _push(self, item: T | _End) -> None:
        with self._lock:
            self._items.append(item)
            if self._wakeup_pending:
                return
            self._wakeup_pending = True
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is gone (shutdown): nobody is listening any more
            self.cancelled.set()

    # ----- the consumer's side (the event loop) ------------------------------------------

    async def runs(self) -> AsyncGenerator[list[T], None]:
        """Everything that arrived since the last run, as one list, until the producer ends.
        Leaving early (closing this generator) sets `cancelled`."""
        try:
            while True:
                await self._ready.wait()
                with self._lock:
                    items = list(self._items)
                    self._items.clear()
                    self._wakeup_pending = False
                # A put after the lock is released schedules a new set(), which runs after
                # this clear(): the loop runs this code without interruption up to the await.
                self._ready.clear()
                run: list[T] = []
                for item in items:
                    if isinstance(item, _End):
                        if run:
                            yield run
                        if item.error is not None:
                            raise item.error
                        return
                    run.append(item)
                if run:
                    yield run
        finally:
            self.cancelled.set()


async def chunk_stream(channel: Channel[GenerationChunk]) -> AsyncGenerator[GenerationChunk, None]:
    """A channel's generation chunks, each run merged into as few chunks as it can be."""
    try:
        async for run in channel.runs():
            for chunk in merge_chunks(run):
                yield chunk
    finally:
        channel.cancelled.set()  # at once: the inner generator is only closed when collected


def merge_chunks(chunks: list[GenerationChunk]) -> list[GenerationChunk]:
    """Consecutive pieces of text (with their logprobs) as one chunk. The last chunk of a
    generation (finish reason, usage) may absorb the text before it; nothing follows it."""
    merged: list[GenerationChunk] = []
    for chunk in chunks:
        if merged and _joinable(merged[-1], chunk):
            last = merged[-1]
            counted = last.prompt_tokens if last.prompt_tokens is not None else chunk.prompt_tokens
            merged[-1] = replace(chunk, text=last.text + chunk.text, logprobs=last.logprobs + chunk.logprobs,
                                 prompt_tokens=counted, token_count=last.token_count + chunk.token_count)  # fmt: skip
        else:
            merged.append(chunk)
    return merged


def _joinable(first: GenerationChunk, then: GenerationChunk) -> bool:
    return first.finish_reason is None and first.usage is None and _plain(first) and _plain(then)


def _plain(chunk: GenerationChunk) -> bool:
    """Text only: reasoning and tool-call pieces keep their own chunks."""
    return not (chunk.reasoning or chunk.tool_calls)
