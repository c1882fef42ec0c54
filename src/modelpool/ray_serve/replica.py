"""A model replica: one Ray Serve replica running a `ModelPool` of its own over the model(s)
of one application. Queues, batching, keep-alive and engine restarts are the pool's, as in
one process; this class only turns calls from the ingress into pool calls and results
into `wire` pieces."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import ray
from ray import serve

from modelpool.config.environment import apply_openmp_waits
from modelpool.config.schema import Config, ModelConfig, ServerDefaults
from modelpool.errors import InvalidRequest, ModelpoolError
from modelpool.logs import configure_logging, current_request_id
from modelpool.pool_api.results import Outcome, SpeechAudio, Transcription
from modelpool.pool_api.streams import ResultStream
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
    waits_only,
)
from modelpool.runtime.build import build_pool
from modelpool.runtime.pool import ModelPool
from modelpool.status import EngineLogs

log = logging.getLogger("modelpool.ray")

EVICTION_DRAIN_S = 30.0
"""How long an evicted model's running requests may take to finish before they are cut."""
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
    defaults = _own_defaults(config, models)
    return config.model_copy(update={"models": models, "enabled_models": None, "pool": pool, "defaults": defaults})


def _own_defaults(config: Config, models: dict[str, ModelConfig]) -> ServerDefaults:
    """`defaults.models` narrowed to the models this replica serves: the whole config was
    checked at load, and a replica's pool checks each default it is given against its own
    models (another application's default would stop this replica from starting)."""
    names = {name for model in models.values() for name in (model.id, *model.aliases)}
    own = {task: name for task, name in config.defaults.models.items() if name in names}
    return config.defaults.model_copy(update={"models": own})


class ModelReplica:
    """Wrapped by `serve.deployment` in `apps.py`. `group_size`: a multiplexed group's
    models per replica (None: a model of its own, loaded when the replica starts)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self, config: dict[str, Any], model_ids: list[str], group_size: int | None = None
    ) -> None:
        parsed = Config.model_validate(config)
        configure_logging(parsed.server.log_format, parsed.server.log_level)
        apply_openmp_waits()  # before its engines load OpenMP (a worker may have loaded it already)
        self.pool: ModelPool = build_pool(replica_config(parsed, model_ids, group_size))
        self._overrides: dict[str, dict[str, Any]] = {}
        self._started = False
        context = ray.get_runtime_context()
        self.placement = Placement(
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            replica_id=serve.get_replica_context().replica_id.unique_id,
        )

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this once the replica is made, before it takes requests, and again
        when the application's `user_config` changes (no restart). `user_config: {"overrides":
        {model: {option: value}}}` holds an admin's live overrides: a new replica loads its
        model with them from the start; a running one reloads it."""
        overrides: dict[str, dict[str, Any]] = user_config.get("overrides") or {}
        for model_id, options in overrides.items():
            if options != self._overrides.get(model_id):
                await self.pool.load(model_id, overrides=options)
        self._overrides = overrides
        await self._start()

    async def _start(self) -> None:
        """Load what preloads (a model of its own: the replica is routable once it has it; a
        failure stays on its slot and answers 503), then start the idle reaper. Once."""
        if self._started:
            return
        self._started = True
        await self.pool.preload()
        self.pool.start()

    async def __del__(self) -> None:
        await self.pool.close()  # Serve awaits this when it stops the replica

    # ----- calls from the ingress ----------------------------------------------------

    async def unary(self, call: Call) -> Done[Any] | Failed:
        if call.method not in UNARY:
            return Failed(InvalidRequest(f"'{call.method}' is not a call a replica answers"))
        await self._start()  # a deployment made without user_config gets no reconfigure call
        request_token = current_request_id.set(call.request_id or "-")
        try:
            await self._resident(call.model)
            method: Callable[..., Awaitable[Outcome[Any]]] = getattr(self.pool, call.method)
            outcome = await method(call.model, *call.args, call.options)
        except ModelpoolError as error:
            return Failed(error)
        finally:
            current_request_id.reset(request_token)
        return Done(outcome)

    async def stream(self, call: Call) -> AsyncGenerator[Piece, None]:
        """The call's results as pieces (see `wire`). Ray Serve cancels this generator when
        the ingress stops reading (its client left): leaving `async with` stops the work
        and gives the model's turn back."""
        if call.method not in STREAMED:
            yield Failed(InvalidRequest(f"'{call.method}' is not a call a replica streams"))
            return
        await self._start()
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

    async def load_adapter(self, model_id: str, adapter: str) -> Failed | None:
        try:
            await self.pool.load_adapter(model_id, adapter)
        except ModelpoolError as error:
            return Failed(error)
        return None

    async def unload_adapter(self, model_id: str, adapter: str) -> Failed | None:
        try:
            await self.pool.unload_adapter(model_id, adapter)
        except ModelpoolError as error:
            return Failed(error)
        return None

    async def engine_logs(self, model_id: str, lines: int) -> EngineLogs | Failed:
        try:
            return await self.pool.engine_logs(model_id, lines)
        except ModelpoolError as error:
            return Failed(error)


def _opened(opened: ResultStream[Any] | Transcription | SpeechAudio) -> tuple[ResultStream[Any], Started]:
    match opened:
        case Transcription(segments, audio_seconds):
            return segments, Started(waits_only(segments.timing), audio_seconds=audio_seconds)
        case SpeechAudio(chunks, sample_rate):
            return chunks, Started(waits_only(chunks.timing), sample_rate=sample_rate)
        case _:
            return opened, Started(waits_only(opened.timing))


class Resident:
    """A group's model loaded on this replica, as Ray Serve's multiplexing LRU holds it.
    When Serve evicts it, it awaits the object's `__del__` on this replica's loop: the model
    is unloaded from the pool, its running requests given a while to finish. `__del__` is
    set on the instance, not the class, so the garbage collector never calls it."""

    def __init__(self, pool: ModelPool, model_id: str) -> None:
        self.pool = pool
        self.model_id = model_id
        self.__dict__["__del__"] = self._evict  # what Serve's LRU calls (and awaits: it is async)

    async def _evict(self) -> None:
        if self.pool.closing:  # the replica is stopping: the pool unloads everything itself
            return
        log.info("model evicted from this replica", extra={"model": self.model_id})
        try:
            await asyncio.wait_for(self.pool.unload(self.model_id, drain=True), EVICTION_DRAIN_S)
        except asyncio.TimeoutError:
            await self.pool.unload(self.model_id, drain=False)
        except Exception:  # never fail the request whose model is loading in its place
            log.exception("evicting a model failed", extra={"model": self.model_id})


def load_resident(replica: ModelReplica, model_id: str) -> Awaitable[Resident]:
    """What a group replica's multiplexed loader does for a model it does not hold."""

    async def load() -> Resident:
        await replica.pool.load(model_id)
        return Resident(replica.pool, model_id)

    return load()
