"""What the API, the MCP tools and the live transcriber may ask of a pool: `ModelPool` (every
model in this process) and, in Ray mode, `RemotePool` (models in Ray Serve replicas) both
are one. Nothing outside the runtime reaches past it into slots or backends.

A neutral module: it and the types that cross it (`modelpool.pool_api.*`,
`modelpool.status`) import only shared modules, never an implementation. Results are
uniform: every whole result is an `Outcome[T]` (value, timing, usage), every streamed one a
`ResultStream[T]` whose `usage` grows as it runs (audio streams come with a small header:
`Transcription`, `SpeechAudio`). Consumers depend on the narrowest role they need.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

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
from modelpool.status import EngineLogs, ModelStatus, PoolMemory
from modelpool.tasks import Task


class MetricsExport(Protocol):
    """The pool's metrics as the Prometheus text format."""

    def render(self) -> bytes: ...


class PoolLookup(Protocol):
    """Answered at once, from the config: nothing loads."""

    def model_id(self, name: str) -> str: ...
    def model_for(self, name: str | None, task: Task) -> str:
        """`name`, or for a request that names no model, the one it uses (400 if several could)."""
        ...
    def metrics_label(self, name: str) -> str: ...
    def transcription_rate(self, name: str, options: CallOptions = DEFAULT_CALL) -> int: ...
    async def voices(self, name: str | None = None) -> list[ModelVoice]:
        """Every text-to-speech model's voices, or only those of the model `name` names."""
        ...


class PoolRequests(Protocol):
    """Work on a model's turn: a whole result as an `Outcome`, or a stream."""

    async def chat(
        self, name: str, request: ChatRequest, options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[GenerationChunk]: ...
    async def complete(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> ResultStream[ChoiceChunk]: ...
    async def transcribe(
        self, name: str, upload: bytes, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> Transcription: ...
    async def transcribe_samples(
        self, name: str, audio: npt.NDArray[np.float32], request: TranscriptionRequest,
        options: CallOptions = DEFAULT_CALL,
    ) -> Transcription: ...  # fmt: skip
    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio: ...
    async def embed(
        self, name: str, request: EmbeddingRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[EmbeddingResult]: ...
    async def score_pairs(
        self, name: str, request: PairScoreRequest, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[PairScores]: ...
    async def loglikelihood(
        self, name: str, pairs: list[tuple[str, str]], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Loglikelihood]]: ...
    async def generate_all(
        self, name: str, requests: list[CompletionRequest], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[list[Generation]]: ...
    async def tokenize(
        self, name: str | None, job: TokenizeJob, options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Tokenized]: ...
    async def detokenize(
        self, name: str | None, ids: list[int], options: CallOptions = DEFAULT_CALL
    ) -> Outcome[Detokenized]: ...


class PoolStatus(Protocol):
    """Typed snapshots the API renders; never a slot, replica or backend."""

    @property
    def metrics(self) -> MetricsExport: ...
    def readiness(self) -> tuple[bool, dict[str, str]]: ...
    def readiness_problem(self, name: str | None = None) -> ModelpoolError | None: ...
    def statuses(self) -> list[ModelStatus]: ...
    def status(self, name: str) -> ModelStatus: ...
    async def engine_logs(self, name: str, lines: int) -> EngineLogs: ...
    def memory(self) -> PoolMemory: ...


class PoolAdmin(Protocol):
    async def load(
        self, name: str, *, overrides: dict[str, Any] | None = None, replicas: int | None = None
    ) -> None: ...
    async def unload(self, name: str, *, drain: bool = True) -> None: ...
    async def load_adapter(self, name: str, adapter: str) -> None: ...
    async def unload_adapter(self, name: str, adapter: str) -> None: ...


class PoolLifetime(Protocol):
    """Only whoever assembles the server starts and closes the pool."""

    def start(self) -> None: ...
    async def close(self) -> None: ...


class PoolApi(PoolLookup, PoolRequests, PoolStatus, PoolAdmin, PoolLifetime, Protocol):
    """The whole interface: what the server's routes, taken together, use."""
