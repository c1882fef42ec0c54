"""What the API, the MCP tools and the live transcriber may ask of a pool: `ModelPool` (every
model in this process) and, in Ray mode, `RemotePool` (models in Ray Serve replicas) both
are one. Nothing outside the runtime reaches past it into slots or backends."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from modelpool.config.schema import SamplingDefaults
from modelpool.errors import ModelpoolError
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    PairScoreRequest,
    PairScores,
    SpeechRequest,
    TranscriptionRequest,
)
from modelpool.runtime.call import CallOptions
from modelpool.runtime.clock import Clock
from modelpool.runtime.generation import ChoiceChunk, Generation
from modelpool.runtime.lease import ResultStream
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.pool import DEFAULT_CALL, ModelVoice, SpeechAudio, Transcription
from modelpool.runtime.scoring import Loglikelihood
from modelpool.runtime.status import EngineLogs, ModelStatus, PoolMemory
from modelpool.runtime.timing import RequestTiming
from modelpool.runtime.tokenization import Detokenized, Tokenized, TokenizeJob


class PoolApi(Protocol):
    metrics: Metrics
    clock: Clock

    # ----- lookup (answered at once, from the config) --------------------------------
    def model_id(self, name: str) -> str: ...
    def sampling_defaults(self, name: str) -> SamplingDefaults: ...
    def metrics_label(self, name: str) -> str: ...
    def transcription_rate(self, name: str, options: CallOptions = DEFAULT_CALL) -> int: ...

    # ----- lifetime ------------------------------------------------------------------
    def start(self) -> None: ...
    async def close(self) -> None: ...
    def readiness(self) -> tuple[bool, dict[str, str]]: ...
    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None: ...

    # ----- requests ------------------------------------------------------------------
    async def chat(
        self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[GenerationChunk]: ...
    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[ChoiceChunk]: ...
    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[EmbeddingResult, RequestTiming]: ...
    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> tuple[PairScores, RequestTiming]: ...
    async def transcribe(
        self, name: str, upload: bytes, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> Transcription: ...
    async def transcribe_samples(
        self, name: str, audio: npt.NDArray[np.float32], request: TranscriptionRequest,
        options: CallOptions = DEFAULT_CALL,
    ) -> Transcription: ...  # fmt: skip
    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio: ...
    async def voices(self) -> list[ModelVoice]: ...
    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> list[Loglikelihood]: ...
    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> list[Generation]: ...
    async def tokenize(self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL) -> Tokenized: ...
    async def detokenize(
        self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL
    ) -> Detokenized: ...

    # ----- admin and status ----------------------------------------------------------
    async def load(
        self, name: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None
    ) -> None: ...
    async def unload(self, name: str, *, drain: bool = True) -> None: ...
    def statuses(self) -> list[ModelStatus]: ...
    def status(self, name: str) -> ModelStatus: ...
    async def engine_logs(self, name: str, lines: int) -> EngineLogs: ...
    def memory(self) -> PoolMemory: ...
