"""POST /v1/audio/speech request body."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, field_validator

from modelpool.api.schemas.common import PoolFields, Text
from modelpool.audio.encode import FORMATS
from modelpool.inference import SpeechRequest

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
