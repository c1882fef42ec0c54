"""The audio API: POST /v1/audio/speech's body and its audio (a file, streamed as it is
synthesised, or `speech.audio.delta` events), and the transcription stream's events."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import AliasChoices, Field, field_validator

from modelpool.audio.encode import FORMATS, AudioEncoder
from modelpool.inference import Segment, SpeechRequest
from modelpool.wire.common import PoolFields, Text
from modelpool.wire.sse import sse

AudioFormat = Literal["wav", "pcm", "mp3", "opus", "flac", "aac"]
assert set(FORMATS) == set(AudioFormat.__args__)  # type: ignore[attr-defined]


class SpeechBody(PoolFields):
    model: str = Field(min_length=1)
    input: Text = Field(min_length=1)
    voice: str | None = None
    """A voice of the model (GET /v1/audio/voices); a single-voice model takes any name."""
    response_format: AudioFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    deterministic: bool = False
    """modelpool extension: no sampling noise, so the same input gives the same audio."""
    instructions: str | None = None
    language: str | None = Field(default=None, min_length=1, validation_alias=AliasChoices("language", "lang"))
    """modelpool extension (`lang` is accepted too): the language of `input`, which picks a
    multilingual model's phonemiser (Kokoro: `ja`, `en`, `en-us`, `en-gb`); None: the voice's own."""

    @field_validator("input")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must hold some text")
        return value

    @field_validator("instructions")
    @classmethod
    def _no_instructions(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("voice instructions are not supported by these models")
        return value

    def to_request(self) -> SpeechRequest:
        return SpeechRequest(self.input, self.voice, self.speed, self.deterministic, self.language)


async def encoded_speech(audio: AsyncIterator[npt.NDArray[np.int16]], encoder: AudioEncoder) -> AsyncIterator[bytes]:
    """The audio encoded as it comes, off the event loop: mp3, aac or opus of a long chunk
    (4,096 characters without a full stop, at speed 0.25: ~18 minutes) takes seconds of
    CPU, which on the loop would hold every other request. One call at a time, in order."""
    async for pcm in audio:
        data = await asyncio.to_thread(encoder.encode, pcm)
        if data:
            yield data  # a sentence is on its way while the next one is synthesised
    yield await asyncio.to_thread(encoder.finish)


async def speech_events(audio: AsyncIterator[npt.NDArray[np.int16]], encoder: AudioEncoder) -> AsyncIterator[bytes]:
    async for data in encoded_speech(audio, encoder):
        if data:
            yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    yield sse({"type": "speech.audio.done", "usage": None})


async def transcript_events(
    segments: AsyncIterator[Segment], on_done: Callable[[list[Segment]], Awaitable[None]] | None
) -> AsyncIterator[bytes]:
    """`transcript.text.delta` per segment, then `transcript.text.done`; `on_done` (storing
    the segments) runs before it, so a client that saw `done` can query the store."""
    done: list[Segment] = []
    async for segment in segments:
        done.append(segment)
        yield sse({"type": "transcript.text.delta", "delta": segment.text})
    if on_done is not None:
        await on_done(done)
    yield sse({"type": "transcript.text.done", "text": "".join(segment.text for segment in done).strip()})
