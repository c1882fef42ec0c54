"""The backend contract: what a backend class declares, and one Protocol per task.

To write a backend, read `BackendClass`: a class with `Options` (its pydantic options),
`capabilities` (a `Capabilities`: tasks, modalities, locality, ...), `overridable` and
`capabilities_for(options)`, constructed as `cls(model, options, context)`, whose instances
implement `Backend` plus the Protocol of every task it declares (`TASK_PROTOCOLS`) and, for
an engine process of its own, `ProcessBackend`. The runtime checks that at load
(`contract_problem`), so a gap is a clear load error, never an AttributeError mid-request.
`tests/fakes.py` holds the smallest complete backend.

Backends are small and dumb. They run requests; they never decide when to load, never
queue across requests and never know HTTP. There is one generation path per task, and it
streams: non-streaming answers are assembled from the stream by the runtime.
Closing a generation iterator stops the generation. A generation raises problems with the
request itself (prompt too long, ...) before its first chunk, and its first chunk comes
early (it may be empty), so the API can still answer such problems with a 4xx.
The data that crosses the contract lives in `modelpool.inference`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel
from typing_extensions import TypeIs, get_protocol_members

from modelpool.backends.context import BackendContext
from modelpool.capabilities import Capabilities, Locality
from modelpool.config.schema import ModelConfig
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    EncodedPair,
    GenerationChunk,
    PairScoreRequest,
    Segment,
    SpeechRequest,
    TokenLogprob,
    TokenPiece,
    TranscriptionRequest,
    Voice,
)
from modelpool.tasks import Task


@dataclass(frozen=True)
class MemoryEstimate:
    """What a model will hold once started, judged before starting."""

    ram_bytes: int
    gpu_bytes: int = 0


class BackendClass(Protocol):
    """What a backend class declares before any instance exists (the registry reads it)."""

    Options: type[BaseModel]
    """Its options, validated from the model's `options:` before anything loads."""
    capabilities: Capabilities
    """The most it can do (see `modelpool.capabilities.Capabilities`)."""
    overridable: frozenset[str]
    """Option names an admin may change for one load (POST /v1/admin/models/{id}/load)."""

    def capabilities_for(self, options: Any) -> Capabilities:
        """`capabilities`, narrowed by these options (a classmethod)."""

    def __call__(self, model: ModelConfig, options: Any, context: BackendContext) -> Backend:
        """A backend that is not started yet: cheap, touches no weights."""


class DeclaredBackend:
    """Defaults for the class-level declarations; a backend may inherit them or say all itself."""

    capabilities: ClassVar[Capabilities]
    overridable: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def capabilities_for(cls, options: Any) -> Capabilities:
        return cls.capabilities


@runtime_checkable
class Backend(Protocol):
    async def estimate_memory(self) -> MemoryEstimate:
        """Memory the model will need once started, judged before starting (from its files)."""

    async def start(self) -> None:
        """Load weights / spawn the process. Raises ModelLoadFailed (or a subclass)."""

    async def warmup(self) -> None:
        """Run one tiny request so the first real one is not the slow one."""

    async def stop(self) -> None:
        """Free everything. Safe to call after a failed or partial start."""

    async def check_health(self) -> None:
        """Raise if the backend can no longer serve."""


@runtime_checkable
class ChatBackend(Backend, Protocol):
    def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]: ...


@runtime_checkable
class CompletionBackend(Backend, Protocol):
    def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]: ...


@runtime_checkable
class ScoringBackend(Backend, Protocol):
    async def tokenize(self, text: str) -> list[int]:
        """The model's tokens for `text`, without BOS or other special tokens."""

    async def start_token(self) -> int | None:
        """The beginning-of-text token (the context of an empty prompt), if the model has one."""

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        """Each token's log-probability given the ones before it (None for the first), its top
        `top_n` alternatives, and whether it was the greedy choice. Raises a 4xx error when
        the tokens do not fit the context."""


@runtime_checkable
class TranscriptionBackend(Backend, Protocol):
    def transcribe(self, request: TranscriptionRequest) -> AsyncGenerator[Segment, None]:
        """Segments as they are decoded (audio at the declared `audio_input_rate`); closing
        the iterator stops the decode."""


@runtime_checkable
class SpeechBackend(Backend, Protocol):
    async def voices(self) -> list[Voice]:
        """The voices, read from the model's files: works on a backend that is not started,
        so listing voices never loads a model."""

    def synthesize(self, request: SpeechRequest) -> AsyncGenerator[npt.NDArray[np.int16], None]:
        """Mono int16 samples at `sample_rate`, a sentence at a time; closing the iterator
        stops synthesis."""

    @property
    def sample_rate(self) -> int:
        """The rate of the synthesised samples (known once started)."""


@runtime_checkable
class EmbeddingBackend(Backend, Protocol):
    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """Vectors for every input (an upstream may compute them whole)."""


@runtime_checkable
class TokenEmbeddingBackend(EmbeddingBackend, Protocol):
    """Embeddings computed here from token ids: the runtime tokenizes, caches and batches
    several requests into one engine call."""

    async def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        """Token ids per input, checked against the model's limits (raises a 4xx error)."""

    async def embed_tokens(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        """One row per prepared input, in order."""

    def concurrent_batches(self) -> int:
        """How many `embed_tokens` calls compute at once, each at its own pace (its compute
        lanes); the micro-batcher keeps that many batches in flight."""


@runtime_checkable
class PairScoringBackend(Backend, Protocol):
    """Relevance of text pairs computed here (cross-encoders): the runtime encodes each
    request's pairs, then batches pairs of several requests into one engine call."""

    async def prepare_pairs(self, request: PairScoreRequest) -> list[EncodedPair]:
        """Each pair encoded as the model reads it, checked against its limits (a 4xx error
        for an over-long pair unless the request allows truncation)."""

    async def score_encoded(self, pairs: list[EncodedPair]) -> npt.NDArray[np.float32]:
        """One score per pair, in order (the model's activation applied)."""

    def concurrent_batches(self) -> int:
        """How many `score_encoded` calls compute at once (see TokenEmbeddingBackend)."""


@runtime_checkable
class TokenizerBackend(Backend, Protocol):
    """A model whose tokenizer modelpool can use (POST /tokenize and /detokenize), declared
    with `Capabilities(tokenizer=True)`. It is not a task: any model may have one. Called on a
    started backend, on a turn of the model; these methods never generate."""

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        """The ids of `text`, special-token text in it (`<|im_end|>`) read as that token;
        `add_special_tokens` adds what the tokenizer puts around a text (BOS, [CLS] … [SEP])."""

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        """The prompt ids that chat generation would be fed for `request` (the model's chat
        template, its tools and template variables), with the assistant's opening when
        `add_generation_prompt`. No chat template: InvalidRequest(param="messages")."""

    async def decode_tokens(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens written out. An id outside the vocabulary:
        InvalidRequest(param="tokens")."""

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        """Each id's bytes and spelling (ids already checked), or None when the engine
        cannot tell them (the API then refuses the request that asked)."""

    async def max_model_len(self) -> int | None:
        """The most tokens one request may hold, prompt and completion, when known."""


@runtime_checkable
class AdapterBackend(Backend, Protocol):
    """Loads and unloads the model's declared LoRA adapters at run time (the admin API);
    requests name them in `ChatRequest.adapter` / `CompletionRequest.adapter`."""

    async def load_adapter(self, name: str) -> None: ...
    async def unload_adapter(self, name: str) -> bool:
        """False: it was not loaded."""
        ...

    def loaded_adapters(self) -> list[str]:
        """Adapters held now, least recently used first."""
        ...

    def adapter_bytes(self) -> int:
        """Memory the adapters held now take."""
        ...


@runtime_checkable
class ProcessBackend(Backend, Protocol):
    """A backend whose engine is a process of its own (`Locality.ENGINE_PROCESS`): it can
    crash, it has output, its memory is its own, and (persistent) it may outlive modelpool."""

    @property
    def pid(self) -> int | None: ...

    @property
    def port(self) -> int | None: ...

    def supervise(self, on_crash: Callable[[str], None]) -> None:
        """Call `on_crash(message)` if the process dies without being asked to."""

    def resident_bytes(self) -> int:
        """Resident memory of the process and its children."""

    def log_tail(self, count: int) -> list[str]:
        """The process's last `count` output lines."""

    async def detach(self) -> None:
        """modelpool is stopping: leave a persistent process running, stop any other."""


@runtime_checkable
class PlacedBackend(Backend, Protocol):
    """An in-process backend that can say where its weights sit (PyTorch devices)."""

    def placement(self) -> dict[str, str]:
        """Module → device (`{"": "cpu"}` for a model on one device); empty before the load."""


@runtime_checkable
class GrowingBackend(Backend, Protocol):
    """An in-process backend whose memory grows under load past what its load measured (a
    KV cache that grows with its batch), up to a bound it knows."""

    def growth_bound(self) -> MemoryEstimate:
        """The most it may grow by under load (0 before the load): the pool counts it as the
        model's from the load on, so that the budget holds when the batch is full."""


TASK_PROTOCOLS: Mapping[Task, type[Backend]] = {
    Task.CHAT: ChatBackend,
    Task.COMPLETION: CompletionBackend,
    Task.SCORING: ScoringBackend,
    Task.EMBEDDING: EmbeddingBackend,
    Task.TRANSCRIPTION: TranscriptionBackend,
    Task.SPEECH: SpeechBackend,
    Task.RERANK: PairScoringBackend,
}


P = TypeVar("P")


def implements(backend: object, protocol: type[P]) -> TypeIs[P]:
    """`isinstance(backend, protocol)` for a runtime-checkable backend Protocol, answered
    once per backend class. Why: on Python 3.11 each such isinstance walks the protocol's
    members (12–27 µs measured), and the request path asks several times per request — one
    embedding request spent more time in these checks than in rendering its reply. A
    method-only protocol is met by the class (a backend implements the contract through its
    methods); a protocol with data members (`ProcessBackend.pid`) is asked of the instance."""
    if not _methods_only(protocol):
        return isinstance(backend, protocol)
    key = (type(backend), protocol)
    found = _CLASS_IMPLEMENTS.get(key)
    if found is None:
        members = get_protocol_members(protocol)
        found = _CLASS_IMPLEMENTS[key] = all(callable(getattr(key[0], name, None)) for name in members)
    return found


_CLASS_IMPLEMENTS: dict[tuple[type[Any], type[Any]], bool] = {}
"""(backend class, method-only protocol) → whether the class has every member."""
_METHODS_ONLY: dict[type[Any], bool] = {}


def _methods_only(protocol: type[Any]) -> bool:
    found = _METHODS_ONLY.get(protocol)
    if found is None:
        members = get_protocol_members(protocol)
        found = _METHODS_ONLY[protocol] = all(callable(getattr(protocol, name, None)) for name in members)
    return found


def contract_problem(
    backend: object, tasks: frozenset[Task], locality: Locality, *, tokenizer: bool = False
) -> str | None:
    """Why `backend` cannot serve `tasks` (or the `tokenizer` it declares) as declared: the
    task and the missing member, or None."""
    wanted: list[tuple[str, type[Any]]] = [("every model", Backend)]
    wanted += [(f"task '{task.value}'", TASK_PROTOCOLS[task]) for task in sorted(tasks, key=lambda t: t.value)]
    if tokenizer:
        wanted.append(("a declared tokenizer", TokenizerBackend))
    if locality is Locality.ENGINE_PROCESS:
        wanted.append(("an engine process", ProcessBackend))
    for purpose, protocol in wanted:
        missing = [name for name in sorted(get_protocol_members(protocol)) if not hasattr(backend, name)]
        if missing:
            return f"{purpose} needs {protocol.__name__}, and it lacks {', '.join(missing)}"
    return None
