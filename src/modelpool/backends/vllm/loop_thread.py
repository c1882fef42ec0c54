"""An asyncio event loop on a thread of its own, for an engine written for asyncio.

vLLM's `AsyncLLM` binds its output handler to the loop it is created on and expects that
loop to be free to run it. Sharing modelpool's loop would make every request's tokens
wait behind HTTP work and vice versa, and vLLM's blocking calls (tokenizing, rendering a
chat template, shutdown) would stall the server. So the engine lives on this loop, and
modelpool's side reaches it with `run_coroutine_threadsafe`: `call` for one answer,
`stream` for an async generator's items. Closing a stream (a client that left) cancels the
engine-side coroutine, which is where vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_END = object()
"""The engine-side generator is exhausted."""


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"vllm-{name}", daemon=True)
        self._unsettled: set[concurrent.futures.Future[Any]] = set()
        """Outcomes of calls not ended yet: `stop` cancels them, as nothing will run them then."""
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on this loop and wait for it here. Cancelling the waiter cancels it
        there and waits until it has ended: an async generator it was advancing is then done
        running (finalised by the cancellation), so closing it afterwards cannot collide."""
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
        started: list[asyncio.Task[T]] = []
        self._unsettled.add(outcome)
        outcome.add_done_callback(self._unsettled.discard)
        self.loop.call_soon_threadsafe(self._start, coroutine, outcome, started)
        ended = asyncio.wrap_future(outcome)
        try:
            return await asyncio.shield(ended)
        except asyncio.CancelledError:
            # Queued behind `_start` on the same loop, so the task exists when this runs.
            self.loop.call_soon_threadsafe(lambda: started[0].cancel())
            await asyncio.wait([ended])
            raise

    def _start(
        self, coroutine: Coroutine[Any, Any, T], outcome: concurrent.futures.Future[T], started: list[asyncio.Task[T]]
    ) -> None:
        task = self.loop.create_task(coroutine)
        started.append(task)
        task.add_done_callback(lambda done: _settle(outcome, done))

    async def stream(self, open_items: Callable[[], Coroutine[Any, Any, AsyncIterator[T]]]) -> AsyncGenerator[T, None]:
        """The items of the async iterator `open_items()` makes on this loop, one hop each.
        Closing this generator closes that iterator on its own loop (vLLM aborts there)."""
        items = await self.call(open_items())
        try:
            while True:
                item = await self.call(_next(items))
                if item is _END:
                    return
                yield item  # type: ignore[misc]  # _END is the only other value
        finally:
            await asyncio.shield(self.call(_close(items)))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop once what runs on it finishes; called after the engine is shut down."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            for outcome in list(self._unsettled):
                outcome.cancel()
            self.loop.close()


async def _next(items: AsyncIterator[T]) -> T | object:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return _END


async def _close(items: AsyncIterator[Any]) -> None:
    """Close `items` unless it is still running: a second cancellation of the waiter can leave
    it mid-step, and then the cancelled step finalises it."""
    if hasattr(items, "aclose") and not getattr(items, "ag_running", False):
        await items.aclose()


def _settle(outcome: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    """`task`'s ending, handed to the waiter on the other loop."""
    if task.cancelled():
        outcome.cancel()
    elif (error := task.exception()) is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(task.result())
