"""A lease (one admitted request's turn on one replica) and the stream type that holds a
lease until it is closed (the pool's `ResultStream` in one process).

Whoever takes a turn gives it back by leaving `async with lease:` or by closing the
`LeasedStream` the lease was handed to. Both are idempotent, so a turn is given back exactly
once whatever happens (an abandoned async generator would never run its finally).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Generic, TypeVar

from modelpool import tracing
from modelpool.backends.base import Backend
from modelpool.errors import ModelUnloaded
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.admission import Ticket
from modelpool.runtime.replicas import Replica

B = TypeVar("B", bound=Backend, covariant=True)
T = TypeVar("T")
_NOTHING = object()


class Lease(Generic[B]):
    """A turn on one replica whose backend serves the task it was leased for (`backend`,
    typed by that task's Protocol: the slot checked it). The turn is the backend's span of
    the request's trace (when traced): it ends when the turn is given back."""

    def __init__(
        self,
        model_id: str,
        replica: Replica,
        backend: B,
        ticket: Ticket,
        timing: RequestTiming,
        keep_alive: float | None,
        on_release: Callable[[Lease[Backend]], None],
    ) -> None:
        self.model_id = model_id
        self.replica = replica
        self._backend = backend
        self.timing = timing
        self.keep_alive = keep_alive
        self._ticket = ticket
        self._on_release = on_release
        self._released = False
        self._span = tracing.start_span("modelpool.backend", {tracing.MODEL: model_id, tracing.REPLICA: replica.index})
        replica.take()

    @property
    def backend(self) -> B:
        return self._backend

    @property
    def revoked(self) -> bool:
        """A forced unload: the request must stop at its next step."""
        return self.replica.revoked

    def check_revoked(self) -> None:
        if self.replica.revoked:
            raise ModelUnloaded(f"model '{self.model_id}' was unloaded while this request ran")

    async def __aenter__(self) -> Lease[B]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None:
            self.failed(error)
        self.release()

    def failed(self, error: BaseException) -> None:
        """The work on this turn raised `error`: shown on its span. The end of a stream and
        cancellation (a client that left) are not failures."""
        if isinstance(error, Exception) and not isinstance(error, StopAsyncIteration):
            self._span.record_error(error)

    def release(self) -> None:
        """Give the turn back (once; later calls do nothing)."""
        if self._released:
            return
        self._released = True
        self.replica.give_back()
        self._ticket.done()
        self._on_release(self)
        self._end_span()

    def _end_span(self) -> None:
        timing = self.timing
        if timing.prompt_tokens or timing.output_tokens:  # counted so far (a stream cut off too); none for audio
            self._span.set_attribute(tracing.INPUT_TOKENS, timing.prompt_tokens)
            self._span.set_attribute(tracing.OUTPUT_TOKENS, timing.output_tokens)
        self._span.end()


class LeasedStream(Generic[T]):
    """Results of one request as they come, holding the model's turn until closed.

    `prefetch()` runs it up to its first item, so that problems with the request itself
    (prompt too long, bad template) raise before any response has started and still get a
    4xx. `aclose()` also works on a stream nobody iterated. A forced unload revokes the
    lease: the stream then stops at its next item.
    """

    def __init__(
        self,
        items: AsyncGenerator[T, None],
        lease: Lease[Backend],
        *,
        observe: Callable[[T], None] | None = None,
        on_close: Callable[[RequestTiming], None] | None = None,
        usage: RequestUsage | None = None,
    ) -> None:
        self.model_id = lease.model_id
        self.timing = lease.timing
        self.usage = usage or RequestUsage()
        """What the request used so far (its observers fill it in as items pass)."""
        self._items = items
        self._lease = lease
        self._observe = observe
        self._on_close = on_close
        self._first: object = _NOTHING
        self._closed = False

    async def prefetch(self) -> None:
        with contextlib.suppress(StopAsyncIteration):  # an empty stream closes itself
            self._first = await self.__anext__()

    def __aiter__(self) -> LeasedStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._first is not _NOTHING:
            first, self._first = self._first, _NOTHING
            return first  # type: ignore[return-value]  # _first holds a T whenever it is not _NOTHING
        if self._closed:
            raise StopAsyncIteration
        try:
            self._lease.check_revoked()
            item = await self._items.__anext__()
        except BaseException as exc:
            self._lease.failed(exc)
            await self.aclose()
            raise
        if self._observe is not None:
            self._observe(item)
        return item

    async def __aenter__(self) -> LeasedStream[T]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._items.aclose()  # stops the generation (and closes an upstream response)
        finally:
            self._lease.release()
            if self._on_close is not None:
                self._on_close(self.timing)


async def open_stream(
    lease: Lease[B],
    start: Callable[[B], AsyncGenerator[T, None]],
    *,
    observe: Callable[[T], None] | None = None,
    on_close: Callable[[RequestTiming], None] | None = None,
    usage: RequestUsage | None = None,
) -> LeasedStream[T]:
    """Hand `lease` to a stream of `start(backend)`'s items, prefetched; if starting fails,
    the turn goes back at once."""
    try:
        items = start(lease.backend)
    except BaseException:
        lease.release()
        raise
    stream = LeasedStream(items, lease, observe=observe, on_close=on_close, usage=usage)
    await stream.prefetch()
    return stream
