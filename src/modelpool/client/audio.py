"""Speech roles: speech-to-text (multipart upload) and text-to-speech (audio bytes, whole
or streamed as the server synthesises)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from modelpool.client.base import RoleClient
from modelpool.client.live import LiveRequest, LiveResult, live_transcription
from modelpool.client.presets import Role
from modelpool.client.results import Speech, Transcript, Voice, transcript, voices

AudioSource = bytes | Path | str
"""Audio bytes, or the path of an audio file."""

_AUDIO_MAGIC = [
    (b"RIFF", "audio.wav", "audio/wav"),
    (b"fLaC", "audio.flac", "audio/flac"),
    (b"OggS", "audio.ogg", "audio/ogg"),
    (b"ID3", "audio.mp3", "audio/mpeg"),
    (b"\xff\xfb", "audio.mp3", "audio/mpeg"),
    (b"\x1aE\xdf\xa3", "audio.webm", "audio/webm"),
]


class STTClient(RoleClient):
    kind: ClassVar[Role] = Role.STT

    async def transcribe(
        self,
        audio: AudioSource,
        *,
        language: str | None = None,
        prompt: str | None = None,
        filename: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Transcript:
        """Language, duration and segments come back when the endpoint does `verbose_json`."""
        data, name, mime = audio_upload(audio, filename)
        response_format = "verbose_json" if self.endpoint.capabilities.verbose_json else "json"
        fields = {"response_format": response_format, "language": language or self.endpoint.language,
                  "prompt": prompt}  # fmt: skip
        form = {key: _form_value(value) for key, value in self._body(fields, extra_body).items()}
        raw = await self._transport.post_form("/v1/audio/transcriptions", form, {"file": (name, data, mime)})
        return transcript(raw)

    def live_transcribe(
        self,
        chunks: AsyncIterable[bytes],
        *,
        sample_rate: int = 24000,
        language: str | None = None,
        turn_detection: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[LiveResult]:
        """Transcribe live audio over a WebSocket (`/v1/realtime?intent=transcription`):
        `chunks` are raw 16-bit little-endian mono PCM at `sample_rate` (16000 or 24000),
        sent as they come. Yields `LiveDelta`s (settled text while an utterance is still
        spoken) and a `LiveUtterance` per utterance the server's VAD closes (its settings:
        `turn_detection`, e.g. `{"silence_duration_ms": 500}`); the last utterance is
        closed when `chunks` ends."""
        url = self.base_url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime?intent=transcription"
        request = LiveRequest(url, self.endpoint.api_key, self.model, sample_rate, language or self.endpoint.language,
                              dict(turn_detection) if turn_detection is not None else None)  # fmt: skip
        return live_transcription(request, chunks)


class TTSClient(RoleClient):
    kind: ClassVar[Role] = Role.TTS

    async def speak(
        self,
        text: str,
        *,
        voice: str | None = None,
        response_format: str = "wav",
        speed: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Speech:
        body = self._speech_body(text, voice, response_format, speed, extra_body)
        response = await self._transport.post_bytes("/v1/audio/speech", body)
        return Speech(response.content, response_format)

    async def stream_speak(
        self,
        text: str,
        *,
        voice: str | None = None,
        response_format: str = "wav",
        speed: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[bytes]:
        """The encoded audio in chunks as they arrive (modelpool sends a sentence at a time);
        joined they equal what `speak` returns."""
        body = self._speech_body(text, voice, response_format, speed, extra_body)
        async with self._transport.stream("/v1/audio/speech", body) as response:
            async for chunk in response.aiter_bytes():
                if chunk:
                    yield chunk

    async def voices(self) -> list[Voice]:
        """Every voice the server lists at /v1/audio/voices (modelpool: of all its speech
        models; `Voice.model` says whose). Servers without the route raise NotFound."""
        return voices(await self._transport.get_json("/v1/audio/voices"))

    def _speech_body(
        self, text: str, voice: str | None, response_format: str, speed: float | None,
        extra_body: Mapping[str, Any] | None,
    ) -> dict[str, Any]:  # fmt: skip
        fields = {"input": text, "voice": voice or self.endpoint.voice, "response_format": response_format,
                  "speed": speed}  # fmt: skip
        return self._body(fields, extra_body)


def audio_upload(audio: AudioSource, filename: str | None = None) -> tuple[bytes, str, str]:
    """(bytes, file name, MIME type) for the multipart upload; the name's extension helps
    servers that pick a decoder by it."""
    if isinstance(audio, bytes):
        data, name = audio, filename
    else:
        path = Path(audio)
        data, name = path.read_bytes(), filename or path.name
    for magic, default_name, mime in _AUDIO_MAGIC:
        if data.startswith(magic):
            return data, name or default_name, mime
    return data, name or "audio.bin", "application/octet-stream"


def _form_value(value: object) -> str | list[str]:
    """Multipart fields are text; a list becomes a repeated field (`timestamp_granularities[]`)."""
    if isinstance(value, (list, tuple)):
        return [str(_form_value(item)) for item in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
