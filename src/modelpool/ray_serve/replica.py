"""A model replica: one Ray Serve replica running a `ModelPool` of its own over the model(s)
of one application. Queues, batching, keep-alive and engine restarts are the pool's, as in
one process; this class only turns calls from the ingress into pool calls and results
into `wire` pieces."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import ray
from ray import serve

from modelpool.config.schema import Config
from modelpool.errors import InvalidRequest, ModelpoolError
from modelpool.logs import configure_logging, current_request_id
from modelpool.ray_serve.wire import (
    Call,
    Done,
    Ended,
    Failed,
    Item,
    Piece,
    Placement,
    ReplicaReport,
    Started,
    uncounted,
)
from modelpool.runtime.build import build_pool
from modelpool.runtime.lease import ResultStream
from modelpool.runtime.pool import ModelPool, SpeechAudio, Transcription
from modelpool.runtime.status import EngineLogs
from modelpool.runtime.timing import RequestTiming
from modelpool.runtime.usage import RequestUsage, current_usage

log = logging.getLogger("modelpool.ray")

UNARY = frozenset({"embed", "score_pairs", "loglikelihood", "generate_all", "tokenize", "detokenize"})
STREAMED = frozenset({"chat", "complete", "transcribe", "transcribe_samples", "speak"})


def replica_config(config: Config, model_ids: list[str], max_loaded: int | None) -> Config:
    """The config a replica's own pool runs: only its models, one pool replica each (Ray
    makes the replicas), and for a group at most `max_loaded` of them loaded at once."""
    models = {}
    for model_id in model_ids:
        model = config.models[model_id]
        models[model_id] = model.model_copy(
            update={"replicas": 1, "replica_max": 1, "preload": model.preload and max_loaded is None}
        )
    pool = config.pool.model_copy(update={"max_loaded_models": max_loaded}) if max_loaded else config.pool
    return config.model_copy(update={"models": models, "enabled_models": None, "pool": pool})


class ModelReplica:
    """Wrapped by `serve.deployment` in `apps.py`. `group_size`: a multiplexed group's
    models per replica (None: a model of its own, loaded when the replica starts)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self, config: dict[str, Any], model_ids: list[str], group_size: int | None = None
    ) -> None:
        parsed = Config.model_validate(config)
        configure_logging(parsed.server.log_format, parsed.server.log_level)
        self.pool: ModelPool = build_pool(replica_config(parsed, model_ids, group_size))
        self._overrides: dict[str, dict[str, Any]] = {}
        context = ray.get_runtime_context()
        self.placement = Placement(
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            replica_id=serve.get_replica_context().replica_id.unique_id,
        )
        await self.pool.preload()  # a model of its own: routable once loaded (a failure stays on its slot)
        self.pool.start()

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Admin load overrides (`user_config: {"overrides": {model: {option: value}}}`): every
        replica, and every later one, reloads its model with them."""
        overrides: dict[str, dict[str, Any]] = user_config.get("overrides") or {}
        for model_id, options in overrides.items():
            if options != self._overrides.get(model_id):
                await self.pool.load(model_id, overrides=options)
        self._overrides = overrides

    async def __del__(self) -> None:
        await self.pool.close()

    # ----- calls from the ingress ----------------------------------------------------

    async def unary(self, call: Call) -> Done[Any] | Failed:
        if call.method not in UNARY:
            return Failed(InvalidRequest(f"'{call.method}' is not a call a replica answers"))
        usage = RequestUsage()
        token = current_usage.set(usage)
        request_token = current_request_id.set(call.request_id or "-")
        try:
            await self._resident(call.model)
            method: Callable[..., Awaitable[Any]] = getattr(self.pool, call.method)
            value = await method(call.model, *call.args, call.options)
        except ModelpoolError as error:
            return Failed(error)
        finally:
            current_usage.reset(token)
            current_request_id.reset(request_token)
        return Done(value, usage)

    async def stream(self, call: Call) -> AsyncGenerator[Piece, None]:
        """The call's results as pieces (see `wire`). Ray Serve cancels this generator when
        the ingress stops reading (its client left): leaving `async with` stops the work
        and gives the model's turn back."""
        if call.method not in STREAMED:
            yield Failed(InvalidRequest(f"'{call.method}' is not a call a replica streams"))
            return
        request_token = current_request_id.set(call.request_id or "-")
        try:
            await self._resident(call.model)
            method: Callable[..., Awaitable[Any]] = getattr(self.pool, call.method)
            opened = await method(call.model, *call.args, call.options)
        except ModelpoolError as error:
            yield Failed(error)
            return
        finally:
            current_request_id.reset(request_token)
        items, started = _opened(opened)
        async with items:
            yield started
            try:
                async for value in items:
                    yield Item(value)
            except ModelpoolError as error:
                yield Failed(error)
                return
        yield Ended()

    async def _resident(self, model_id: str) -> object:
        """Makes `model_id` one of the replica's resident models. A model of its own always is;
        group replicas override this with Serve's multiplexed loader (`apps.group_replica`)."""
        return None

    # ----- control -------------------------------------------------------------------

    def report(self) -> ReplicaReport:
        return ReplicaReport(self.placement, self.pool.statuses())

    async def load(self, model_id: str) -> Failed | None:
        try:
            await self._resident(model_id)
            await self.pool.load(model_id)
        except ModelpoolError as error:
            return Failed(error)
        return None

    async def unload(self, model_id: str, drain: bool) -> None:
        await self.pool.unload(model_id, drain=drain)

    async def engine_logs(self, model_id: str, lines: int) -> EngineLogs | Failed:
        try:
            return await self.pool.engine_logs(model_id, lines)
        except ModelpoolError as error:
            return Failed(error)


def _opened(opened: ResultStream[Any] | Transcription | SpeechAudio) -> tuple[ResultStream[Any], Started]:
    match opened:
        case Transcription(segments, audio_seconds):
            return segments, Started(_wire_timing(segments), audio_seconds=audio_seconds)
        case SpeechAudio(chunks, sample_rate):
            return chunks, Started(_wire_timing(chunks), sample_rate=sample_rate)
        case _:
            return opened, Started(_wire_timing(opened))


def _wire_timing(stream: ResultStream[Any]) -> RequestTiming:
    return uncounted(stream.timing)


class Resident:
    """A group's model loaded on this replica, as Ray Serve's multiplexing LRU holds it.
    Serve calls `__del__` (in a thread) when it evicts the model: the model is unloaded
    from this replica's pool. Later calls (the garbage collector's) do nothing."""

    def __init__(self, pool: ModelPool, model_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.model_id = model_id
        self._loop = loop
        self._gone = False

    def __del__(self) -> None:
        if self._gone:
            return
        self._gone = True
        unloading = asyncio.run_coroutine_threadsafe(self._unload(), self._loop)
        if threading.current_thread() is not threading.main_thread() and not self._loop_is_here():
            unloading.result(timeout=60)  # Serve's eviction thread: the next model loads after this one left

    def _loop_is_here(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _unload(self) -> None:
        log.info("model evicted from this replica", extra={"model": self.model_id})
        await self.pool.unload(self.model_id)


def load_resident(replica: ModelReplica, model_id: str) -> Awaitable[Resident]:
    """What a group replica's multiplexed loader does for a model it does not hold."""

    async def load() -> Resident:
        loop = asyncio.get_running_loop()
        await replica.pool.load(model_id)
        return Resident(replica.pool, model_id, loop)

    return load()
