"""The task methods of a backend whose model runs on an OpenAI-compatible server: an engine
process modelpool manages, or a remote upstream. Requests are translated to the wire
format and the upstream's stream is passed back chunk by chunk, never buffered."""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.remote.client import UpstreamClient
from modelpool.backends.textgen.reasoning import split_reasoning
from modelpool.config.schema import ModelConfig
from modelpool.errors import UpstreamUnavailable
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationChunk,
    Segment,
    SpeechRequest,
    TranscriptionRequest,
    Voice,
    Word,
)
from modelpool.wire.openai import upstream as openai_wire

SEGMENT_SCORES = ("avg_logprob", "no_speech_prob", "compression_ratio", "temperature")
Translate = Callable[[AsyncGenerator[dict[str, Any], None]], AsyncGenerator[GenerationChunk, None]]
TranslateWhole = Callable[[dict[str, Any]], list[GenerationChunk]]


TRANSCRIPTION_RATE = 16_000
"""Audio is decoded to this rate and sent upstream as WAV (the upstream resamples as it likes)."""


class ForwardingBackend:
    """Chat, completions, embeddings and audio through `self.upstream`. Subclasses open the
    client in `start()` and say which model name the upstream knows the model by."""

    model: ModelConfig
    upstream: UpstreamClient | None = None
    upstream_model: str = ""
    speech_sample_rate: int = 24_000
    """The rate of the upstream's PCM speech."""

    def client(self) -> UpstreamClient:
        if self.upstream is None:
            raise UpstreamUnavailable("the model's upstream is not running (the model is not loaded)")
        return self.upstream

    def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        body = openai_wire.chat_body(request, request.adapter or self.upstream_model)  # vLLM serves an adapter by name
        if request.streamed:
            chunks = self._forward("chat/completions", body, openai_wire.chat_chunks)
        else:
            chunks = self._whole("chat/completions", body, openai_wire.chat_whole)
        parser = self.model.reasoning_parser  # the kit's reasoning stage, as the in-process engines apply it
        return split_reasoning(chunks, parser) if parser else chunks

    def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        body = openai_wire.completion_body(request, request.adapter or self.upstream_model)
        if request.streamed:
            return self._forward("completions", body, openai_wire.completion_chunks)
        return self._whole("completions", body, openai_wire.completion_whole)

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        body = openai_wire.embeddings_body(request.inputs, self.upstream_model)
        payload = await self.client().post_json("embeddings", body)
        vectors = openai_wire.embedding_vectors(payload, len(request.inputs))
        usage = openai_wire.usage_of(payload)
        return EmbeddingResult(vectors, usage.prompt_tokens if usage else 0)

    async def _forward(
        self, path: str, body: dict[str, Any], translate: Translate
    ) -> AsyncGenerator[GenerationChunk, None]:
        events = await self.client().stream_events(path, body)  # 4xx raise here, before any chunk
        # Closing this generator closes both below it, and so the upstream response: the
        # upstream stops generating when our client leaves.
        async with aclosing(events), aclosing(translate(events)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _whole(
        self, path: str, body: dict[str, Any], translate: TranslateWhole
    ) -> AsyncGenerator[GenerationChunk, None]:
        """A client that wants the whole answer: one plain upstream response, no stream."""
        for chunk in translate(await self.client().post_json(path, body)):
            yield chunk

    # ----- audio ---------------------------------------------------------------------

    async def transcribe(self, request: TranscriptionRequest) -> AsyncGenerator[Segment, None]:
        """The upstream's verbose_json segments (one segment when it only gives text)."""
        fields = {"model": self.upstream_model, "response_format": "verbose_json"}
        fields["temperature"] = str(request.temperature)
        if request.language and request.task == "transcribe":
            fields["language"] = request.language
        if request.prompt:
            fields["prompt"] = request.prompt
        if request.word_timestamps:
            fields["timestamp_granularities[]"] = "word"
        path = "audio/translations" if request.task == "translate" else "audio/transcriptions"
        upload = ("audio.wav", _wav(request.audio, TRANSCRIPTION_RATE), "audio/wav")
        payload = await self.client().post_form(path, fields, upload)
        for segment in _segments(payload, len(request.audio) / TRANSCRIPTION_RATE):
            yield segment

    @property
    def sample_rate(self) -> int:
        return self.speech_sample_rate

    async def voices(self) -> list[Voice]:
        return [Voice(self.upstream_model, "", self.speech_sample_rate)]

    async def synthesize(self, request: SpeechRequest) -> AsyncGenerator[npt.NDArray[np.int16], None]:
        """The upstream's raw PCM (16-bit little-endian mono), passed on as it arrives."""
        body: dict[str, Any] = {"model": self.upstream_model, "input": request.text, "voice": request.voice or "alloy",
                                "response_format": "pcm", "speed": request.speed}  # fmt: skip
        if request.deterministic:  # modelpool's extension: sent only when asked for
            body["deterministic"] = True
        carry = b""
        async with aclosing(await self.client().stream_bytes("audio/speech", body)) as chunks:
            async for chunk in chunks:
                data = carry + chunk
                usable = len(data) - len(data) % 2  # a sample can be split across chunks
                carry = data[usable:]
                if usable:
                    yield np.frombuffer(data[:usable], dtype="<i2").astype(np.int16)


def _wav(audio: npt.NDArray[np.float32], sample_rate: int) -> bytes:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def _segments(payload: Any, duration_s: float) -> list[Segment]:
    if not isinstance(payload, dict):
        return []
    language = str(payload.get("language") or "")
    segments = payload.get("segments")
    if not isinstance(segments, list) or not segments:
        text = str(payload.get("text") or "")
        return [Segment(0, 0.0, duration_s, text, language=language)] if text else []
    words = [_word(w) for w in payload.get("words") or [] if isinstance(w, dict)]
    result = []
    for index, item in enumerate(segments):
        start, end = float(item.get("start", 0.0)), float(item.get("end", 0.0))
        last = index == len(segments) - 1
        inside = tuple(w for w in words if start <= w.start < end or (last and w.start >= end))
        score = {key: float(item.get(key, 0.0)) for key in SEGMENT_SCORES}
        result.append(Segment(
            int(item.get("id", index)), start, end, str(item.get("text", "")), inside,
            avg_logprob=score["avg_logprob"], no_speech_prob=score["no_speech_prob"],
            compression_ratio=score["compression_ratio"], temperature=score["temperature"], language=language,
        ))  # fmt: skip
    return result


def _word(item: dict[str, Any]) -> Word:
    return Word(
        float(item.get("start", 0.0)), float(item.get("end", 0.0)), str(item.get("word", "")),
        float(item.get("probability", 1.0)),
    )  # fmt: skip
