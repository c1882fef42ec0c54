"""Run a blocking engine on one thread that the backend owns.

llama.cpp contexts (and CUDA contexts) are not free-threaded, so every call into an
engine goes through the same single worker thread, in submission order. The event loop
only ever awaits futures.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from modelpool.backends.textgen.channel import Channel

T = TypeVar("T")


def call_in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a thread of its own that has ended when this returns.

    For loading a model: OpenMP (libgomp, which PyTorch and llama.cpp use) keeps a pool of
    worker threads for every thread that ever ran a parallel region, for as long as that
    thread lives, and while the process holds more such workers than it has CPUs, every
    pool's workers stop spinning between regions and go to sleep, so each of the engine
    thread's regions pays to wake its worker. A load run on asyncio's executor threads
    (which live on) left such a pool behind: measured on 2 cores, a one-row 576→1536 linear
    on the engine thread took 150 µs against 77, and the transformers engine made 13.7
    tokens/s at one stream against 18.3 once the load's thread had ended.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="passing") as passing:
        return passing.submit(fn, *args).result()


async def in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` from the event loop on a thread that ends with it (see
    `call_in_passing_thread`); cancelled, the call runs on to its end and its thread ends then."""
    passing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="passing")
    try:
        return await asyncio.wrap_future(passing.submit(fn, *args))
    finally:
        passing.shutdown(wait=False)


class EngineThread:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"engine-{name}")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.wrap_future(self._executor.submit(fn, *args, **kwargs))

    async def stream(self, produce: Callable[[threading.Event], Iterator[T]]) -> AsyncGenerator[T, None]:
        """Iterate `produce(cancel)` on the engine thread and yield its items here; items
        that pile up while the consumer is busy cross to the event loop in one wakeup.

        Closing the returned iterator sets `cancel`; the producer checks it between
        items, so generation stops within one step and the thread is free again.
        """
        channel: Channel[T] = Channel(asyncio.get_running_loop())
        cancel = channel.cancelled

        def run() -> None:
            if cancel.is_set():  # the consumer left while we were queued behind another call
                return
            iterator = produce(cancel)
            try:
                for item in iterator:
                    if cancel.is_set():
                        break
                    channel.put(item)
            except BaseException as exc:
                channel.end(exc)
            else:
                channel.end()
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()

        self._executor.submit(run)
        try:
            async for run_of_items in channel.runs():
                for item in run_of_items:
                    yield item
        finally:
            cancel.set()  # at once: the inner generator is only closed when collected

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


async def drain(items: AsyncIterator[Any]) -> None:
    """Run an async iterator to its end, dropping what it yields (warmups)."""
    async for _ in items:
        continue
