"""The synchronous facade, for scripts and notebooks-without-a-loop:

    from modelpool.client import sync
    with sync.make_llm("models.yaml", "agent_llm") as llm:
        print(llm.chat([ChatMessage.user("Hi")]).content)

Each sync client owns a private event loop (asyncio.Runner on Python ≥ 3.11, a plain new
loop on 3.10) and drives the async client on it, so the behaviour — errors, readiness,
reasoning aliasing — is the async client's, not a second implementation. Streams are
plain iterators; leaving one early closes the HTTP stream. Not for use inside a running
event loop (use the async clients there).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypedDict, TypeVar, overload

from typing_extensions import Self, Unpack

from modelpool.client.audio import AudioSource, STTClient, TTSClient
from modelpool.client.base import RoleClient
from modelpool.client.embedder import EmbedderClient
from modelpool.client.factory import ConfigLike
from modelpool.client.factory import make_embedder as _make_embedder
from modelpool.client.factory import make_llm as _make_llm
from modelpool.client.factory import make_reranker as _make_reranker
from modelpool.client.factory import make_stt as _make_stt
from modelpool.client.factory import make_tts as _make_tts
from modelpool.client.factory import make_vlm as _make_vlm
from modelpool.client.live import LiveResult, pulled
from modelpool.client.llm import ChatOptions, CompletionOptions, LLMClient, VLMClient
from modelpool.client.messages import MessageLike
from modelpool.client.reranker import RerankerClient
from modelpool.client.results import (
    ChatDelta,
    ChatResult,
    Completion,
    Embeddings,
    M,
    ParsedChat,
    Reranking,
    Speech,
    Transcript,
    Voice,
)
from modelpool.client.tools import ResponseFormat

T = TypeVar("T")
A = TypeVar("A", bound=RoleClient)


class SpeechOptions(TypedDict, total=False):
    voice: str | None
    response_format: str
    speed: float | None
    extra_body: Mapping[str, Any] | None


class TranscribeOptions(TypedDict, total=False):
    language: str | None
    prompt: str | None
    filename: str | None
    extra_body: Mapping[str, Any] | None


class _Loop:
    """A private event loop: asyncio.Runner where it exists (3.11+), else a new loop.

    Each method branches on `sys.version_info` itself (not on which attribute is set), so a
    type checker sees `_runner` on 3.11+ and `_loop` on 3.10, each always present."""

    def __init__(self) -> None:
        if sys.version_info >= (3, 11):
            self._runner = asyncio.Runner()
        else:  # pragma: no cover - exercised on Python 3.10 only
            self._loop = asyncio.new_event_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if sys.version_info >= (3, 11):
            return self._runner.run(coroutine)
        return self._loop.run_until_complete(coroutine)  # pragma: no cover - Python 3.10

    def iterate(self, stream: AsyncIterator[T]) -> Iterator[T]:
        """A plain iterator over an async one; closing it early closes the stream."""
        try:
            while True:
                try:
                    yield self.run(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                self.run(aclose())

    def close(self) -> None:
        if sys.version_info >= (3, 11):
            self._runner.close()
        else:  # pragma: no cover - Python 3.10
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()


async def _next(stream: AsyncIterator[T]) -> T:
    return await stream.__anext__()


class SyncClient(Generic[A]):
    def __init__(self, client: A) -> None:
        self.client = client
        """The async client underneath."""
        self._loop = _Loop()

    @property
    def model(self) -> str:
        return self.client.model

    def wait_ready(self, timeout_s: float = 120.0, *, poll_s: float = 0.25) -> None:
        self._loop.run(self.client.wait_ready(timeout_s, poll_s=poll_s))

    def close(self) -> None:
        try:
            self._loop.run(self.client.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncLLM(SyncClient[LLMClient]):
    @overload
    def chat(
        self, messages: Sequence[MessageLike], *, response_format: type[M], **options: Unpack[ChatOptions]
    ) -> ParsedChat[M]: ...

    @overload
    def chat(
        self,
        messages: Sequence[MessageLike],
        *,
        response_format: Mapping[str, Any] | None = None,
        **options: Unpack[ChatOptions],
    ) -> ChatResult: ...

    def chat(
        self, messages: Sequence[MessageLike], *, response_format: ResponseFormat = None, **options: Unpack[ChatOptions]
    ) -> ChatResult:
        """LLMClient.chat, blocking: `response_format=Model` gives a ParsedChat[Model]."""
        return self._loop.run(self.client.chat(messages, response_format=response_format, **options))

    def stream_chat(
        self, messages: Sequence[MessageLike], *, response_format: ResponseFormat = None, **options: Unpack[ChatOptions]
    ) -> Iterator[ChatDelta]:
        return self._loop.iterate(self.client.stream_chat(messages, response_format=response_format, **options))

    def complete(self, prompt: str, **options: Unpack[CompletionOptions]) -> Completion:
        return self._loop.run(self.client.complete(prompt, **options))


class SyncVLM(SyncLLM):
    """The blocking VLM client: the LLM's methods, with images in the messages."""


class SyncReranker(SyncClient[RerankerClient]):
    def rerank(
        self,
        query: str,
        documents: Sequence[str | Mapping[str, Any]],
        *,
        top_n: int | None = None,
        return_documents: bool = False,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Reranking:
        coroutine = self.client.rerank(
            query, documents, top_n=top_n, return_documents=return_documents, extra_body=extra_body
        )
        return self._loop.run(coroutine)

    def score(
        self, text_1: str | Sequence[str], text_2: str | Sequence[str], *, extra_body: Mapping[str, Any] | None = None
    ) -> list[float]:
        return self._loop.run(self.client.score(text_1, text_2, extra_body=extra_body))


class SyncEmbedder(SyncClient[EmbedderClient]):
    def embed(self, texts: str | Sequence[str], *, extra_body: Mapping[str, Any] | None = None) -> Embeddings:
        return self._loop.run(self.client.embed(texts, extra_body=extra_body))


class SyncSTT(SyncClient[STTClient]):
    def transcribe(self, audio: AudioSource, **options: Unpack[TranscribeOptions]) -> Transcript:
        return self._loop.run(self.client.transcribe(audio, **options))

    def live_transcribe(
        self, chunks: Iterable[bytes], *, sample_rate: int = 24000, language: str | None = None,
        turn_detection: Mapping[str, Any] | None = None,
    ) -> Iterator[LiveResult]:  # fmt: skip
        """As the async client's; `chunks` (raw pcm16) is read on a worker thread, so a
        source that blocks until audio comes (a microphone) is fine."""
        stream = self.client.live_transcribe(pulled(chunks), sample_rate=sample_rate, language=language,
                                             turn_detection=turn_detection)  # fmt: skip
        return self._loop.iterate(stream)


class SyncTTS(SyncClient[TTSClient]):
    def speak(self, text: str, **options: Unpack[SpeechOptions]) -> Speech:
        return self._loop.run(self.client.speak(text, **options))

    def stream_speak(self, text: str, **options: Unpack[SpeechOptions]) -> Iterator[bytes]:
        return self._loop.iterate(self.client.stream_speak(text, **options))

    def voices(self) -> list[Voice]:
        return self._loop.run(self.client.voices())


def make_llm(config: ConfigLike, role: str) -> SyncLLM:
    return SyncLLM(_make_llm(config, role))


def make_vlm(config: ConfigLike, role: str) -> SyncVLM:
    client: VLMClient = _make_vlm(config, role)
    return SyncVLM(client)


def make_embedder(config: ConfigLike, role: str) -> SyncEmbedder:
    return SyncEmbedder(_make_embedder(config, role))


def make_reranker(config: ConfigLike, role: str) -> SyncReranker:
    return SyncReranker(_make_reranker(config, role))


def make_stt(config: ConfigLike, role: str) -> SyncSTT:
    return SyncSTT(_make_stt(config, role))


def make_tts(config: ConfigLike, role: str) -> SyncTTS:
    return SyncTTS(_make_tts(config, role))
