"""Any stream of results that holds a model's turn until it is closed (speech, transcription).
Like GenerationStream: prefetched to its first item so request errors are still a 4xx, and
closable before it was ever iterated."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from modelpool.errors import ModelUnloaded
from modelpool.runtime.replica import Lease

T = TypeVar("T")
_NOTHING = object()


class LeasedStream(Generic[T]):
    def __init__(self, items: AsyncIterator[T], lease: Lease, on_close: Callable[[], None]) -> None:
        self.model_id = lease.model_id
        self.lease = lease
        self._items = items
        self._on_close = on_close
        self._first: object = _NOTHING
        self._closed = False

    async def prefetch(self) -> None:
        with contextlib.suppress(StopAsyncIteration):
            self._first = await self.__anext__()

    def __aiter__(self) -> LeasedStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._first is not _NOTHING:
            first, self._first = self._first, _NOTHING
            return first  # type: ignore[return-value]
        if self._closed:
            raise StopAsyncIteration
        if self.lease.revoked:
            await self.aclose()
            raise ModelUnloaded(f"model '{self.model_id}' was unloaded while this request ran")
        try:
            return await self._items.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._items, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self.lease.release()
            self._on_close()
