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

from modelpool.config.schema import Config, ModelConfig, SamplingDefaults
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
from modelpool.ray_serve.wire import Call, Started, uncounted
from modelpool.runtime.build import build_pool
from modelpool.runtime.call import CallOptions
from modelpool.runtime.clock import Clock, SystemClock
from modelpool.runtime.generation import ChoiceChunk, Generation
from modelpool.runtime.lease import ResultStream
from modelpool.runtime.memory import system_memory
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.observers import RequestObservers
from modelpool.runtime.pool import DEFAULT_CALL, ModelPool, ModelVoice, SpeechAudio, Transcription
from modelpool.runtime.scoring import Loglikelihood
from modelpool.runtime.status import BudgetStatus, EngineLogs, ModelMemory, ModelStatus, PoolMemory
from modelpool.runtime.timing import RequestTiming
from modelpool.runtime.tokenization import Detokenized, Tokenized, TokenizeJob, tokenizer_slot

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

    def sampling_defaults(self, name: str) -> SamplingDefaults:
        return self.catalog.sampling_defaults(name)

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
        statuses = self.statuses()
        states = {status.id: status.state for status in statuses}
        preloaded = {model.id for model in self.config.served_models() if _starts_loaded(model)}
        ready = not self._closing and all(states[model] == "ready" for model in preloaded)
        return ready, states

    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None:
        if self._closing:
            return ShuttingDown("the server is shutting down")
        if name is not None:  # as a slot answers: None when ready or loading on demand
            status = self.status(name)
            if status.state == "failed":
                return ModelLoadFailed(f"model '{status.id}' failed to load: {status.last_error}")
            if status.state == "loading":
                return ModelNotReady(f"model '{status.id}' is loading")
            if status.state != "ready" and not status.autoload:
                return ModelNotReady(f"model '{status.id}' is not loaded and has autoload off")
            return None
        ready, states = self.readiness()
        if ready:
            return None
        waiting = ", ".join(f"'{model}' ({state})" for model, state in states.items() if state != "ready")
        return ModelNotReady(f"waiting for preloaded models: {waiting}")

    # ----- requests ------------------------------------------------------------------

    async def _unary(self, method: str, name: str, args: tuple[Any, ...], options: CallOptions) -> tuple[Any, str]:
        model_id = self.catalog.model_id(name)
        started = self.clock.monotonic()
        call = Call(method, model_id, args, options, request_id())
        handle = await self._model_handle(model_id)
        retried = self.retries.labels(model=model_id).inc
        done = await call_unary(handle, call, model_id, assignment_wait(self.wait_s), retried)
        if isinstance(done.value, tuple) and len(done.value) == 2 and isinstance(done.value[1], RequestTiming):
            timing = uncounted(done.value[1])
            done = replace(done, value=(done.value[0], timing))
        else:
            usage = done.usage
            timing = RequestTiming(prompt_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
            timing.backend_s = self.clock.monotonic() - started
        self.metrics.observe_timing(model_id, timing)
        return done.value, model_id

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
        timer = self.observe.chunks(model_id, timing)
        return RemoteStream(model_id, pieces, timing, observe=timer, on_close=self.observe.finished(model_id))

    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[ChoiceChunk]:
        model_id, _, pieces, timing = await self._open("complete", name, (requests,), options)
        timer = self.observe.chunks(model_id, timing)

        def observe(piece: ChoiceChunk) -> None:
            timer(piece[1])

        return RemoteStream(model_id, pieces, timing, observe=observe, on_close=self.observe.finished(model_id))

    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[EmbeddingResult, RequestTiming]:
        value, _ = await self._unary("embed", name, (request,), options)
        return value  # type: ignore[no-any-return]

    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[PairScores, RequestTiming]:
        value, _ = await self._unary("score_pairs", name, (request,), options)
        return value  # type: ignore[no-any-return]

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
        on_close = self.observe.audio(model_id, "transcription", lambda: audio_s)
        segments: RemoteStream[Segment] = RemoteStream(model_id, pieces, timing, on_close=on_close)
        return Transcription(segments, audio_s)

    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio:
        model_id, first, pieces, timing = await self._open("speak", name, (request,), options)
        rate = first.sample_rate or 1
        produced = [0]

        def count(pcm: npt.NDArray[np.int16]) -> None:
            produced[0] += len(pcm)

        on_close = self.observe.audio(model_id, "speech", lambda: produced[0] / rate)
        chunks: RemoteStream[npt.NDArray[np.int16]] = RemoteStream(
            model_id, pieces, timing, observe=count, on_close=on_close
        )
        return SpeechAudio(chunks, rate)

    async def voices(self) -> list[ModelVoice]:
        return await self.catalog.voices()  # read from the voices' files here: loads nothing anywhere

    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> list[Loglikelihood]:
        value, _ = await self._unary("loglikelihood", name, (pairs,), options)
        return value  # type: ignore[no-any-return]

    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> list[Generation]:
        value, _ = await self._unary("generate_all", name, (requests,), options)
        return value  # type: ignore[no-any-return]

    async def tokenize(self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL) -> Tokenized:
        value, _ = await self._unary("tokenize", self._tokenizer_model(name), (job,), options)
        return value  # type: ignore[no-any-return]

    async def detokenize(self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL) -> Detokenized:
        value, _ = await self._unary("detokenize", self._tokenizer_model(name), (ids,), options)
        return value  # type: ignore[no-any-return]

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
        budget = self.catalog.budget
        models = {
            status.id: ModelMemory(
                status.state, sum(r.memory_bytes for r in status.replicas), status.memory.measured_bytes
            )
            for status in self.statuses()
        }
        return PoolMemory(
            system=system_memory(),
            gpus=[],
            budget=BudgetStatus(budget.max_models, budget.memory_bytes, budget.gpu_bytes),
            models=models,
        )


def _app_state(app: str) -> tuple[str, str]:
    found = serve.status().applications.get(app)
    return ("NOT_STARTED", "") if found is None else (str(found.status.value), found.message)


def _starts_loaded(model: ModelConfig) -> bool:
    """Readiness waits for models that load when their replicas start (not grouped ones,
    which load on demand, nor ones that scale from zero)."""
    if not model.preload:
        return False
    ray = model.ray
    if ray is None:
        return True
    if ray.group is not None:
        return False
    return ray.autoscaling is None or ray.autoscaling.min_replicas > 0
