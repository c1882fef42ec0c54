"""The backend contract: one Protocol per task, and the plain data that crosses it.

Backends are small and dumb. They run requests; they never decide when to load, never
queue across requests and never know HTTP. There is one generation path per task, and it
streams: non-streaming answers are assembled from the stream by the runtime.
Closing a generation iterator stops the generation. A generation raises problems with the
request itself (prompt too long, ...) before its first chunk, and its first chunk comes
early (it may be empty), so the API can still answer such problems with a 4xx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from modelpool.tasks import Task


@dataclass(frozen=True)
class Limits:
    max_concurrency: int = 1
    """Requests the engine can run at once (1 for a single llama.cpp context)."""
    context_length: int | None = None
    """Most tokens a prompt plus its completion may hold; None when not applicable."""
    max_batch_size: int = 1
    """Most inputs one engine call takes (embeddings)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    """None: until end of sequence or the context is full."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """None: no logprobs; N ≥ 0: the chosen token's logprob plus N top alternatives."""


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    name: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = SamplingParams()
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra variables for the chat template (enable_thinking, source_lang_code, ...)."""
    streamed: bool = True
    """The client reads the answer as it comes. False: it wants it whole, so a forwarding
    backend asks its upstream for one response (cheaper for most servers, and the only way
    some of them report usage). Local engines ignore it."""


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    """Text, or token ids in the model's own vocabulary."""
    sampling: SamplingParams = SamplingParams()
    echo: bool = False
    streamed: bool = True
    """As `ChatRequest.streamed`."""


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float | None
    """None for the first token of an echoed prompt: nothing came before it."""
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()
    greedy: bool = True
    """The token is the most likely one at its position (always, for the first)."""
    token_id: int = -1


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class GenerationChunk:
    """A piece of generated text. The last chunk of a generation has `finish_reason`
    ('stop' or 'length') and `usage` set."""

    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning: str = ""
    """Reasoning text (models with a reasoning parser); `text` is then the answer only."""


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: tuple[str | tuple[int, ...], ...]
    """Texts, or token-id sequences in the model's own vocabulary (no special tokens)."""
    truncate: bool = False
    """Cut over-long inputs to the model's maximum instead of rejecting them."""


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: npt.NDArray[np.float32]
    """Shape (len(inputs), dimensions), in input order."""
    prompt_tokens: int
    token_counts: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class MemoryEstimate:
    """What a model will hold once started, judged before starting."""

    ram_bytes: int
    gpu_bytes: int = 0


@runtime_checkable
class Backend(Protocol):
    tasks: frozenset[Task]
    limits: Limits
    overridable: frozenset[str]
    """Option names an admin may change for one load (POST /v1/admin/models/{id}/load)."""

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
    def chat(self, request: ChatRequest) -> AsyncIterator[GenerationChunk]: ...


@runtime_checkable
class CompletionBackend(Backend, Protocol):
    def complete(self, request: CompletionRequest) -> AsyncIterator[GenerationChunk]: ...


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


@dataclass(frozen=True)
class TranscriptionRequest:
    audio: npt.NDArray[np.float32]
    """Mono samples at the backend's `sample_rate`."""
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    word_timestamps: bool = False
    task: str = "transcribe"
    """transcribe, or translate (into English)."""


@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True)
class Segment:
    id: int
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    compression_ratio: float = 0.0
    temperature: float = 0.0
    tokens: tuple[int, ...] = ()
    language: str = "en"


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: str | None = None
    speed: float = 1.0
    deterministic: bool = False


@dataclass(frozen=True)
class Voice:
    name: str
    language: str
    sample_rate: int
    speaker_id: int | None = None


@runtime_checkable
class TranscriptionBackend(Backend, Protocol):
    sample_rate: int
    languages: frozenset[str] | None
    """What the model understands; None: every language Whisper knows."""

    def transcribe(self, request: TranscriptionRequest) -> AsyncIterator[Segment]:
        """Segments as they are decoded; closing the iterator stops the decode."""


@runtime_checkable
class SpeechBackend(Backend, Protocol):
    sample_rate: int

    def voices(self) -> list[Voice]: ...

    def synthesize(self, request: SpeechRequest) -> AsyncIterator[npt.NDArray[np.int16]]:
        """Mono int16 samples, a sentence at a time; closing the iterator stops synthesis."""


@runtime_checkable
class EmbeddingBackend(Backend, Protocol):
    dimensions: int

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult: ...

    async def prepare(self, request: EmbeddingRequest) -> list[list[int]]:
        """Token ids per input, checked against the model's limits (raises a 4xx error)."""

    async def embed_tokens(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        """One row per prepared input, in order. The pool batches several requests into one call."""


@runtime_checkable
class ForwardedEmbeddingBackend(Backend, Protocol):
    """Embeddings computed by an upstream server: whole requests are forwarded, with no
    local tokenizing, batching or caching (that is the upstream's business)."""

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult: ...


@runtime_checkable
class ProcessBackend(Backend, Protocol):
    """A backend whose engine is a process of its own: it can crash, it has output, its
    memory is its own, and (persistent) it may outlive modelpool."""

    pid: int | None

    def supervise(self, on_crash: Callable[[str], None]) -> None:
        """Call `on_crash(message)` if the process dies without being asked to."""

    def resident_bytes(self) -> int:
        """Resident memory of the process and its children."""

    def log_tail(self, count: int) -> list[str]:
        """The process's last `count` output lines."""

    async def detach(self) -> None:
        """modelpool is stopping: leave a persistent process running, stop any other."""
