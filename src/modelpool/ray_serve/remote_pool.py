"""The ingress's pool: a `PoolApi` whose models run in Ray Serve replicas.

Names, aliases, capabilities, sampling defaults and voices are answered here from the
config (a `ModelPool` built from it that never loads anything: the catalog), so an unknown
model is a 404 without a hop. Every request goes to a replica of its model's application,
whose own pool checks it as one process would and answers the same errors. Tokens and audio
are counted here from what comes back, so the ingress's metrics, per-key usage and rate
limits see every request as in one process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import Counter
from ray import serve
from ray.serve.handle import DeploymentHandle

from modelpool.config.schema import Config
from modelpool.errors import InvalidRequest, ModelLoadFailed, ModelNotReady, ModelpoolError, ShuttingDown
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    PairScoreRequest,
    PairScores,
    Segment,
    SpeechRequest,
    TranscriptionRequest,
)
from modelpool.pool_api.call import DEFAULT_CALL, CallOptions
from modelpool.pool_api.generation import ChoiceChunk, Generation
from modelpool.pool_api.results import (
    Detokenized,
    Loglikelihood,
    ModelVoice,
    Outcome,
    SpeechAudio,
    Tokenized,
    TokenizeJob,
    Transcription,
)
from modelpool.pool_api.streams import ResultStream
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.ray_serve import naming
from modelpool.ray_serve.cluster_view import ClusterView
from modelpool.ray_serve.options import replica_bounds
from modelpool.ray_serve.remote import (
    ControlThread,
    RemoteStream,
    answer_of,
    assignment_wait,
    broadcast,
    call_unary,
    open_remote,
    request_id,
)
from modelpool.ray_serve.remote_status import memory_of, model_readiness_problem, pool_readiness_problem, readiness_of
from modelpool.ray_serve.wire import Call, Started, uncounted
from modelpool.runtime.build import build_pool
from modelpool.runtime.clock import Clock, SystemClock
from modelpool.runtime.metrics.observers import RequestObservers
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.served import ServedPool
from modelpool.runtime.tasks.tokenization import tokenizer_slot
from modelpool.status import EngineLogs, ModelStatus, PoolMemory
from modelpool.tasks import Task

DEPLOY_WAIT_S = 300.0
"""How long an admin change waits for its redeploy when `server.model_wait_s` is unset."""
DEPLOY_POLL_S = 0.25
Redeploy = Callable[[str, dict[str, Any]], None]
"""Redeploy a model application with changed settings (`apps.redeploy`), in a thread."""


class RemotePool:
    def __init__(self, config: Config, redeploy: Redeploy, *, clock: Clock | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        self.clock = clock or SystemClock()
        self.observe = RequestObservers(self.metrics, self.clock)
        self.retries = Counter(
            "modelpool_replica_retries",
            "Calls sent again to another replica after theirs died before answering (Ray mode).",
            ["model"],
            registry=self.metrics.registry,
        )
        self.catalog: ModelPool = build_pool(config, metrics=Metrics(), clock=self.clock)
        self._apps = naming.served_apps(config)
        self._app_of = {model.id: app for app, models in self._apps.items() for model in models}
        self._grouped = {m.id for m in config.served_models() if m.ray is not None and m.ray.group is not None}
        self._handles: dict[str, DeploymentHandle[Any]] = {}
        self._redeploy = redeploy
        self._overrides: dict[str, dict[str, dict[str, Any]]] = {}
        """Per application: the admin's live overrides, sent again with every redeploy."""
        self._replicas: dict[str, int] = {}
        """Per application: the admin's replica count, sent again with every redeploy."""
        self.control = ControlThread()
        grouped_apps = {app for app, models in self._apps.items() if models[0].id in self._grouped}
        self.view = ClusterView(
            self._handle, list(self._apps), grouped_apps, config.ray.status_interval_s, self.control
        )
        self._closing = False

    async def _handle(self, app: str) -> DeploymentHandle[Any]:
        """The application's handle (made once, off the event loop: making one waits on Ray)."""
        if app not in self._handles:
            self._handles[app] = await self.control.run(lambda: serve.get_app_handle(app))
        return self._handles[app]

    async def _model_handle(self, model_id: str) -> DeploymentHandle[Any]:
        handle = await self._handle(self._app_of[model_id])
        if model_id in self._grouped:
            return handle.options(multiplexed_model_id=model_id)
        return handle

    @property
    def wait_s(self) -> float | None:
        return self.config.server.model_wait_s

    # ----- lookup --------------------------------------------------------------------

    def model_id(self, name: str) -> str:
        return self.catalog.model_id(name)

    def model_for(self, name: str | None, task: Task) -> str:
        return self.catalog.model_for(name, task)

    def metrics_label(self, name: str) -> str:
        return self.catalog.metrics_label(name)

    def transcription_rate(self, name: str, options: CallOptions = DEFAULT_CALL) -> int:
        return self.catalog.transcription_rate(name, options)

    # ----- lifetime ------------------------------------------------------------------

    def start(self) -> None:
        self.view.start()

    async def close(self) -> None:
        """Stops watching the replicas; the model applications stay deployed."""
        self._closing = True
        await self.view.stop()
        self.control.close()

    def readiness(self) -> tuple[bool, dict[str, str]]:
        return readiness_of(self.config, self.statuses(), closing=self._closing)

    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None:
        if self._closing:
            return ShuttingDown("the server is shutting down")
        if name is not None:
            return model_readiness_problem(self.status(name))
        return pool_readiness_problem(*self.readiness())

    # ----- requests ------------------------------------------------------------------

    async def _unary(self, method: str, name: str, args: tuple[Any, ...], options: CallOptions) -> Outcome[Any]:
        """A whole result from a replica: its pool's `Outcome`, whose tokens the ingress counts
        again into its own metrics and the usage it returns."""
        model_id = self.catalog.model_id(name)
        call = Call(method, model_id, args, options, request_id())
        handle = await self._model_handle(model_id)
        retried = self.retries.labels(model=model_id).inc
        try:
            done = await call_unary(handle, call, model_id, assignment_wait(self.wait_s), retried)
        except ModelpoolError as exc:
            if exc.usage is not None:  # what it used before failing: the ingress counts it, as it bills it
                self.metrics.count_tokens(
                    model_id, input_tokens=exc.usage.input_tokens, output_tokens=exc.usage.output_tokens
                )
            raise
        timing, usage = uncounted(done.outcome.timing), RequestUsage()
        self.observe.ended(model_id, timing, usage)
        return Outcome(done.outcome.value, timing, usage)

    async def _open(
        self, method: str, name: str, args: tuple[Any, ...], options: CallOptions
    ) -> tuple[str, Started, Any, RequestTiming]:
        model_id = self.catalog.model_id(name)
        started = self.clock.monotonic()
        call = Call(method, model_id, args, options, request_id())
        retried = self.retries.labels(model=model_id).inc
        first, pieces = await open_remote(
            await self._model_handle(model_id), call, model_id, assignment_wait(self.wait_s), retried
        )
        timing = replace(first.timing, started=started)
        return model_id, first, pieces, timing

    async def chat(
        self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[GenerationChunk]:
        model_id, _, pieces, timing = await self._open("chat", name, (request,), options)
        usage = RequestUsage()
        timer = self.observe.chunks(model_id, timing, usage)
        on_close = self.observe.finished(model_id, usage)
        return RemoteStream(model_id, pieces, timing, observe=timer, on_close=on_close, usage=usage)

    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[ChoiceChunk]:
        model_id, _, pieces, timing = await self._open("complete", name, (requests,), options)
        usage = RequestUsage()
        timer = self.observe.chunks(model_id, timing, usage)

        def observe(piece: ChoiceChunk) -> None:
            timer(piece[1])

        on_close = self.observe.finished(model_id, usage)
        return RemoteStream(model_id, pieces, timing, observe=observe, on_close=on_close, usage=usage)

    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[EmbeddingResult]:
        return await self._unary("embed", name, (request,), options)

    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[PairScores]:
        return await self._unary("score_pairs", name, (request,), options)

    async def transcribe(
        self, name: str, upload: bytes, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> Transcription:
        return await self._transcription("transcribe", name, (upload, request), options)

    async def transcribe_samples(
        self, name: str, audio: npt.NDArray[np.float32], request: TranscriptionRequest,
        options: CallOptions = DEFAULT_CALL,
    ) -> Transcription:  # fmt: skip
        return await self._transcription("transcribe_samples", name, (audio, request), options)

    async def _transcription(
        self, method: str, name: str, args: tuple[Any, ...], options: CallOptions
    ) -> Transcription:
        model_id, first, pieces, timing = await self._open(method, name, args, options)
        audio_s = first.audio_seconds or 0.0
        usage = RequestUsage()
        on_close = self.observe.audio(model_id, "transcription", lambda: audio_s, usage)
        segments: RemoteStream[Segment] = RemoteStream(model_id, pieces, timing, on_close=on_close, usage=usage)
        return Transcription(segments, audio_s)

    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio:
        model_id, first, pieces, timing = await self._open("speak", name, (request,), options)
        rate = first.sample_rate or 1
        produced = [0]

        def count(pcm: npt.NDArray[np.int16]) -> None:
            produced[0] += len(pcm)

        usage = RequestUsage()
        on_close = self.observe.audio(model_id, "speech", lambda: produced[0] / rate, usage)
        chunks: RemoteStream[npt.NDArray[np.int16]] = RemoteStream(
            model_id, pieces, timing, observe=count, on_close=on_close, usage=usage
        )
        return SpeechAudio(chunks, rate)

    async def voices(self, name: str | None = None) -> list[ModelVoice]:
        return await self.catalog.voices(name)  # read from the voices' files here: loads nothing anywhere

    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Loglikelihood]]:
        return await self._unary("loglikelihood", name, (pairs,), options)

    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Generation]]:
        return await self._unary("generate_all", name, (requests,), options)

    async def tokenize(
        self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Tokenized]:
        return await self._unary("tokenize", self._tokenizer_model(name), (job,), options)

    async def detokenize(
        self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Detokenized]:
        return await self._unary("detokenize", self._tokenizer_model(name), (ids,), options)

    def _tokenizer_model(self, name: str | None) -> str:
        return tokenizer_slot(self.catalog.slots(), None if name is None else self.catalog.slot(name)).id

    # ----- admin ---------------------------------------------------------------------

    async def load(self, name: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None) -> None:
        """Overrides and a replica count redeploy the model's application: Ray Serve applies
        them to the running replicas (a new replica count, or a reload with the overrides)
        and to every later one. Then every replica loads the model (with none running: one
        is started by a routed call, as a request would)."""
        model_id = self.catalog.model_id(name)
        app = self._app_of[model_id]
        changes: dict[str, Any] = {}
        if overrides:
            if model_id in self._grouped:
                raise InvalidRequest(
                    f"model '{model_id}' shares its replicas with its group: set its options in the config",
                    param="overrides",
                )
            self.catalog.with_overrides(model_id, overrides)  # checked here: a bad one is a 400 before any redeploy
            current = self._overrides.get(app, {})
            changes["overrides"] = {**current, model_id: {**current.get(model_id, {}), **overrides}}
        if replicas is not None:
            low, high = replica_bounds(self._apps[app], self.config)
            if not low <= replicas <= high:
                raise InvalidRequest(f"replicas must be between {low} and {high}", param="replicas")
            changes["num_replicas"] = replicas
        if changes:
            await self._apply(app, model_id, changes)
        handle = await self._model_handle(model_id)
        loaded = await broadcast(handle, model_id, "load", model_id, timeout_s=self.wait_s)
        if not loaded:  # no replica running (scaled to zero): a routed call starts one, as a request would
            await answer_of(handle.load.remote(model_id), model_id, assignment_wait(self.wait_s))
        await self.view.refresh()

    async def _apply(self, app: str, model_id: str, changes: dict[str, Any]) -> None:
        """Redeploy `app` with the admin's changes so far (earlier ones are kept) and wait
        until Ray Serve runs it again."""
        overrides = changes.get("overrides", self._overrides.get(app, {}))
        replicas = changes.get("num_replicas", self._replicas.get(app))
        await self.control.run(lambda: self._redeploy(app, {"overrides": overrides, "num_replicas": replicas}))
        self._overrides[app] = overrides
        if replicas is not None:
            self._replicas[app] = replicas
        deadline = self.clock.monotonic() + (self.wait_s or DEPLOY_WAIT_S)
        while True:
            state, message = await self.control.run(lambda: _app_state(app))
            if state == "RUNNING":
                return
            if state == "DEPLOY_FAILED":
                raise ModelLoadFailed(f"model '{model_id}': Ray Serve could not deploy it: {message}")
            if self.clock.monotonic() > deadline:
                raise ModelNotReady(f"model '{model_id}' is still being redeployed ({state}): see its status")
            await asyncio.sleep(DEPLOY_POLL_S)

    async def load_adapter(self, name: str, adapter: str) -> None:
        """Every running replica loads the adapter (each checks the name against its model)."""
        await self._adapters(name, adapter, "load_adapter")

    async def unload_adapter(self, name: str, adapter: str) -> None:
        await self._adapters(name, adapter, "unload_adapter")

    async def _adapters(self, name: str, adapter: str, method: str) -> None:
        model_id = self.catalog.model_id(name)
        await broadcast(await self._handle(self._app_of[model_id]), model_id, method, model_id, adapter,
                        timeout_s=self.wait_s)  # fmt: skip
        await self.view.refresh()

    async def unload(self, name: str, *, drain: bool = True) -> None:
        """Frees the model's weights on every replica; the replicas stay (Ray Serve scales
        them), and the next request loads the model again, as in one process."""
        model_id = self.catalog.model_id(name)
        await broadcast(await self._handle(self._app_of[model_id]), model_id, "unload", model_id, drain,
                        timeout_s=self.wait_s)  # fmt: skip
        await self.view.refresh()

    # ----- status --------------------------------------------------------------------

    def statuses(self) -> list[ModelStatus]:
        return [self.view.merged(self._app_of[slot.id], slot.status()) for slot in self.catalog.slots()]

    def status(self, name: str) -> ModelStatus:
        slot = self.catalog.slot(name)
        return self.view.merged(self._app_of[slot.id], slot.status())

    async def engine_logs(self, name: str, lines: int) -> EngineLogs:
        model_id = self.catalog.model_id(name)
        handle = await self._handle(self._app_of[model_id])
        processes = []
        for answer in await broadcast(handle, model_id, "engine_logs", model_id, lines, timeout_s=10):
            processes += answer.processes
        return EngineLogs(model_id, self.status(model_id).state, processes)

    def memory(self) -> PoolMemory:
        return memory_of(self.statuses(), self.catalog.budget)


def _app_state(app: str) -> tuple[str, str]:
    found = serve.status().applications.get(app)
    return ("NOT_STARTED", "") if found is None else (str(found.status.value), found.message)


def _implements(pool: RemotePool) -> ServedPool:
    return pool  # mypy checks here that RemotePool implements the whole interface, as ModelPool does
