"""Calls from the ingress to model replicas through Ray Serve handles, and what Ray's own
failures become for the client: the envelope a single-process server would send, never a
bare 500 or a hang."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from ray import exceptions as ray_errors
from ray.serve import exceptions as serve_errors
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

from modelpool.errors import GenerationFailed, ModelNotReady, ModelpoolError, Overloaded, ReplicaUnavailable
from modelpool.logs import current_request_id
from modelpool.ray_serve.wire import Call, Done, Ended, Failed, Item, Started
from modelpool.runtime.timing import RequestTiming

log = logging.getLogger("modelpool.ray")
T = TypeVar("T")
R = TypeVar("R")

_REPLICA_GONE = (
    ray_errors.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray_errors.ObjectLostError,  # a result lost with its node (OwnerDiedError too)
    ray_errors.NodeDiedError,
    ray_errors.WorkerCrashedError,
    ray_errors.LocalRayletDiedError,
    serve_errors.ReplicaUnavailableError,
)


def as_pool_error(error: BaseException, model_id: str) -> ModelpoolError:
    """The modelpool error for what Ray raised while a replica served `model_id`."""
    if isinstance(error, ModelpoolError):
        return error
    if isinstance(error, serve_errors.BackPressureError):
        return Overloaded(f"model '{model_id}' has too many requests queued; retry later", retry_after_s=1)
    if isinstance(error, serve_errors.DeploymentUnavailableError):
        return ModelNotReady(f"model '{model_id}' has no replica that can serve it now: {error}")
    if isinstance(error, _REPLICA_GONE):
        return ReplicaUnavailable(f"the replica serving model '{model_id}' went away mid-request; retry")
    if isinstance(error, ray_errors.RayTaskError) and isinstance(error.cause, _REPLICA_GONE):
        return ReplicaUnavailable(f"the replica serving model '{model_id}' went away mid-request; retry")
    log.error("unexpected error from a Ray replica", exc_info=error, extra={"model": model_id})
    return GenerationFailed(f"model '{model_id}' failed on its replica")


def _no_replica(model_id: str, wait_s: float) -> ModelNotReady:
    return ModelNotReady(f"no replica of model '{model_id}' took the request within {wait_s:g} s")


async def call_unary(handle: DeploymentHandle[Any], call: Call, model_id: str, wait_s: float | None) -> Done[Any]:
    """`call` on one replica. Waiting for a replica to take it is bounded by `wait_s` (a
    503 after); once taken, the call runs as long as it needs."""
    response = cast("DeploymentResponse[Any]", handle.unary.remote(call))
    try:
        try:
            ref = await asyncio.wait_for(response._to_object_ref(), wait_s)
        except asyncio.TimeoutError:
            raise _no_replica(model_id, wait_s or 0) from None
        answer: Done[Any] | Failed = await ref
    except asyncio.CancelledError:
        response.cancel()
        raise
    except ModelpoolError:
        response.cancel()
        raise
    except Exception as exc:
        raise as_pool_error(exc, model_id) from None
    if isinstance(answer, Failed):
        raise answer.error
    return answer


async def open_remote(
    handle: DeploymentHandle[Any], call: Call, model_id: str, wait_s: float | None
) -> tuple[Started, DeploymentResponseGenerator[Any]]:
    """Start `call` as a stream on a replica and wait (up to `wait_s`) for its first piece:
    `Started` once the replica holds the model's turn, or the request's own error (a 4xx
    before any response has started, as in one process)."""
    pieces = cast("DeploymentResponseGenerator[Any]", handle.options(stream=True).stream.remote(call))
    try:
        first = await asyncio.wait_for(pieces.__anext__(), wait_s)
    except asyncio.TimeoutError:
        pieces.cancel()
        raise _no_replica(model_id, wait_s or 0) from None
    except asyncio.CancelledError:
        pieces.cancel()
        raise
    except Exception as exc:
        pieces.cancel()
        raise as_pool_error(exc, model_id) from None
    if isinstance(first, Failed):
        raise first.error
    if not isinstance(first, Started):
        pieces.cancel()
        raise GenerationFailed(f"model '{model_id}': its replica answered out of order")
    return first, pieces


class RemoteStream(Generic[T]):
    """A `ResultStream` of items a replica streams; closing it cancels the work there."""

    def __init__(
        self,
        model_id: str,
        pieces: DeploymentResponseGenerator[Any],
        timing: RequestTiming,
        *,
        observe: Callable[[T], None] | None = None,
        on_close: Callable[[RequestTiming], None] | None = None,
    ) -> None:
        self.model_id = model_id
        self.timing = timing
        self._pieces = pieces
        self._observe = observe
        self._on_close = on_close
        self._closed = False
        self._finished = False

    def __aiter__(self) -> RemoteStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._closed:
            raise StopAsyncIteration
        try:
            piece = await self._pieces.__anext__()
        except StopAsyncIteration:
            self._finished = True
            await self.aclose()
            raise
        except asyncio.CancelledError:
            await self.aclose()
            raise
        except Exception as exc:
            await self.aclose()
            raise as_pool_error(exc, self.model_id) from None
        match piece:
            case Item(value):
                if self._observe is not None:
                    self._observe(value)
                return value  # type: ignore[no-any-return]  # the replica streams this call's T
            case Failed(error):
                await self.aclose()
                raise error
            case Ended():
                self._finished = True
                await self.aclose()
                raise StopAsyncIteration
        await self.aclose()
        raise GenerationFailed(f"model '{self.model_id}': its replica answered out of order")

    async def aclose(self) -> None:
        """Never suspends, so it also works inside a cancelled task."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._pieces.cancel()
        if self._on_close is not None:
            self._on_close(self.timing)

    async def __aenter__(self) -> RemoteStream[T]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()


class ControlThread:
    """Ray Serve's control calls from the ingress (status reads, redeploys) run here, one at
    a time, off the event loop: building a deployment is not thread-safe (Ray registers and
    unregisters modules in cloudpickle's global registry), so two at once can fail."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve-control")

    async def run(self, work: Callable[[], R]) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def request_id() -> str | None:
    current = current_request_id.get()
    return None if current == "-" else current
