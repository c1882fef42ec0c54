"""The one stream type the pool's streaming requests return (a Protocol: a leased stream in
one process, a replica's stream in Ray mode)."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class ResultStream(Protocol[T_co]):
    """Results of one request as they come. Closing it (or leaving `async with`) stops the
    work and gives the model's turn back. `timing` and `usage` grow as items pass; both are
    final once the stream has ended or been closed."""

    model_id: str
    timing: RequestTiming

    @property
    def usage(self) -> RequestUsage: ...

    def __aiter__(self) -> ResultStream[T_co]: ...

    async def __anext__(self) -> T_co: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> ResultStream[T_co]: ...

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...
