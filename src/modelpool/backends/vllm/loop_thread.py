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
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on this loop and wait for it here; cancelling the waiter cancels it."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

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
            if hasattr(items, "aclose"):
                await asyncio.shield(self.call(items.aclose()))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the loop once what runs on it finishes; called after the engine is shut down."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


async def _next(items: AsyncIterator[T]) -> T | object:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return _END
