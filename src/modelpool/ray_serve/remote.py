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
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.ray_serve.wire import Call, Done, Ended, Failed, Item, Started

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


RETRIED_UNARY = frozenset({"embed", "score_pairs", "tokenize", "detokenize"})
"""Unary calls that change nothing anywhere (the same input, the same answer): one whose
replica died before answering is sent once more, to a surviving replica."""


class ReplicaGone(ReplicaUnavailable):
    """Ray lost the replica (its actor, process or node) before the call's answer (or a
    stream's first piece) came back: nothing of it reached the client. The same envelope as
    `ReplicaUnavailable` when it does reach one."""


def as_pool_error(error: BaseException, model_id: str) -> ModelpoolError:
    """The modelpool error for what Ray raised while a replica served `model_id`."""
    if isinstance(error, ModelpoolError):
        return error
    if isinstance(error, serve_errors.BackPressureError):
        return Overloaded(f"model '{model_id}' has too many requests queued; retry later", retry_after_s=1)
    if isinstance(error, serve_errors.DeploymentUnavailableError):
        return ModelNotReady(f"model '{model_id}' has no replica that can serve it now: {error}")
    if isinstance(error, _REPLICA_GONE) or (
        isinstance(error, ray_errors.RayTaskError) and isinstance(error.cause, _REPLICA_GONE)
    ):
        return ReplicaGone(f"the replica serving model '{model_id}' went away mid-request; retry")
    log.error("unexpected error from a Ray replica", exc_info=error, extra={"model": model_id})
    return GenerationFailed(f"model '{model_id}' failed on its replica")


def assignment_wait(model_wait_s: float | None) -> float | None:
    """How long a call may wait for Ray Serve to hand it to a replica (a scaled-to-zero model
    starting one): the server's `model_wait_s`, at least a second (0 means "do not wait for
    a load" in one process, and handing a call over takes a moment); None: no limit."""
    return None if model_wait_s is None else max(model_wait_s, 1.0)


async def _assigned(response: DeploymentResponse[Any] | DeploymentResponseGenerator[Any], model_id: str,
                    wait_s: float | None) -> None:  # fmt: skip
    """Wait until a replica has taken the call. Only this wait is bounded here: once taken,
    the replica's own pool bounds its load (`model_wait_s`) as one process does, and
    queueing and generation take as long as they take."""
    try:
        await asyncio.wait_for(response._fetch_future_result_async(), wait_s)  # Serve's own wait for a replica
    except asyncio.TimeoutError:
        response.cancel()
        raise ModelNotReady(f"no replica of model '{model_id}' took the request within {wait_s:g} s") from None
    except asyncio.CancelledError:
        response.cancel()
        raise
    except Exception as exc:
        raise as_pool_error(exc, model_id) from None


async def answer_of(response: Any, model_id: str, wait_s: float | None) -> Any:
    """What one replica answers to a routed call, once one takes it (within `wait_s`); a
    `Failed` answer is raised as its error, Ray's failures as modelpool's."""
    routed = cast("DeploymentResponse[Any]", response)
    await _assigned(routed, model_id, wait_s)
    try:
        answer = await routed
    except asyncio.CancelledError:
        routed.cancel()
        raise
    except Exception as exc:
        raise as_pool_error(exc, model_id) from None
    if isinstance(answer, Failed):
        raise answer.error
    return answer


async def call_unary(handle: DeploymentHandle[Any], call: Call, model_id: str, wait_s: float | None,
                     on_retry: Callable[[], None] | None = None) -> Done[Any]:  # fmt: skip
    """`call` on one replica, once one takes it (within `wait_s`). A call of `RETRIED_UNARY`
    whose replica died goes once more to another (Serve's router drops a replica whose actor
    died, and probes before routing): a node lost under load then costs its clients nothing."""
    try:
        done: Done[Any] = await answer_of(handle.unary.remote(call), model_id, wait_s)
    except ReplicaGone:
        if call.method not in RETRIED_UNARY:
            raise
        _retrying(call, model_id, on_retry)
        done = await answer_of(handle.unary.remote(call), model_id, wait_s)
    return done


def _retrying(call: Call, model_id: str, on_retry: Callable[[], None] | None) -> None:
    log.warning(
        "the replica went away before answering: sending the call to another replica",
        extra={"model": model_id, "method": call.method},
    )
    if on_retry is not None:
        on_retry()


async def broadcast(handle: DeploymentHandle[Any], model_id: str, method: str, *args: Any,
                    timeout_s: float | None) -> list[Any]:  # fmt: skip
    """`method(*args)` on every running replica (none running: no answers); a `Failed`
    answer is raised as its error, Ray's failures as modelpool's."""
    try:
        answers = await handle.broadcast(method, *args).results_async(timeout_s=timeout_s)
    except serve_errors.DeploymentUnavailableError:
        return []
    except asyncio.TimeoutError:
        raise ModelNotReady(f"the replicas of model '{model_id}' did not answer within {timeout_s:g} s") from None
    except Exception as exc:
        raise as_pool_error(exc, model_id) from None
    for answer in answers:
        if isinstance(answer, Failed):
            raise answer.error
    return list(answers)


async def open_remote(
    handle: DeploymentHandle[Any], call: Call, model_id: str, wait_s: float | None,
    on_retry: Callable[[], None] | None = None,
) -> tuple[Started, DeploymentResponseGenerator[Any]]:  # fmt: skip
    """Start `call` as a stream on a replica (taken within `wait_s`) and read its first
    piece: `Started` once the replica holds the model's turn, or the request's own error (a
    4xx before any response has started, as in one process). A replica that dies before
    `Started` has sent nothing the client saw: the call goes once more to another."""
    try:
        return await _open_once(handle, call, model_id, wait_s)
    except ReplicaGone:
        _retrying(call, model_id, on_retry)
        return await _open_once(handle, call, model_id, wait_s)


async def _open_once(
    handle: DeploymentHandle[Any], call: Call, model_id: str, wait_s: float | None
) -> tuple[Started, DeploymentResponseGenerator[Any]]:
    pieces = cast("DeploymentResponseGenerator[Any]", handle.options(stream=True).stream.remote(call))
    await _assigned(pieces, model_id, wait_s)
    try:
        first = await pieces.__anext__()
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
        usage: RequestUsage | None = None,
    ) -> None:
        self.model_id = model_id
        self.timing = timing
        self.usage = usage or RequestUsage()
        """What the request used so far, as the ingress counts what passes."""
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
