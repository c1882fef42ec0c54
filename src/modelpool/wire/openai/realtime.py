"""The wire of OpenAI's realtime transcription sessions (`/v1/realtime?intent=transcription`):
client events parsed into settings, runtime events rendered as server events."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modelpool.audio.vad import VadSettings
from modelpool.errors import InvalidRequest, ModelpoolError, RequestTooLarge
from modelpool.pool_api.live import (
    Cleared,
    Committed,
    LiveEvent,
    LiveSettings,
    SpeechStarted,
    SpeechStopped,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
)
from modelpool.wire.openai.errors import error_payload, param_from_loc

CLIENT_EVENTS = ("transcription_session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear")  # fmt: skip


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PcmFormat(_Wire):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[16000, 24000] = 24000


class TranscriptionConfig(_Wire):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class ServerVad(_Wire):
    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=32, le=10000)


class SessionUpdate(_Wire):
    input_audio_format: Literal["pcm16"] | PcmFormat | None = None
    """`pcm16` (24 kHz, OpenAI's), or `{"type": "audio/pcm", "rate": 16000 | 24000}`."""
    input_audio_transcription: TranscriptionConfig | None = None
    turn_detection: ServerVad | None = None
    input_audio_noise_reduction: dict[str, Any] | None = None
    """Accepted and not applied."""
    include: list[str] | None = None
    """Accepted and not applied."""


class SessionState:
    """What the client set, as OpenAI's update semantics have it: only the fields an update
    names change, and `turn_detection: null` turns the VAD off."""

    def __init__(self) -> None:
        self.id = f"sess_{secrets.token_hex(10)}"
        self.rate = 24000
        self.live = LiveSettings()

    def updated(self, session: object) -> tuple[int, LiveSettings]:
        """The (input rate, settings) this update asks for; applied with `apply` once the
        runtime has accepted them."""
        update = _parse(SessionUpdate, session, "session")
        rate, live = self.rate, self.live
        if isinstance(update.input_audio_format, PcmFormat):
            rate = update.input_audio_format.rate
        elif update.input_audio_format == "pcm16":
            rate = 24000
        if update.input_audio_transcription is not None:
            asked = update.input_audio_transcription.model_dump(exclude_unset=True)
            live = replace(live, **asked)
        if "turn_detection" in update.model_fields_set:
            vad = update.turn_detection
            live = replace(live, turn_detection=None if vad is None else VadSettings(
                vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms))  # fmt: skip
        return rate, live

    def apply(self, rate: int, live: LiveSettings) -> None:
        self.rate, self.live = rate, live

    def render(self) -> dict[str, Any]:
        live = self.live
        audio_format: Any = "pcm16" if self.rate == 24000 else {"type": "audio/pcm", "rate": self.rate}
        transcription = {"model": live.model, "language": live.language, "prompt": live.prompt}
        return {
            "id": self.id,
            "object": "realtime.transcription_session",
            "input_audio_format": audio_format,
            "input_audio_transcription": transcription,
            "turn_detection": _vad_json(live.turn_detection),
            "input_audio_noise_reduction": None,
            "include": None,
        }


def _vad_json(vad: VadSettings | None) -> dict[str, Any] | None:
    if vad is None:
        return None
    return {"type": "server_vad", "threshold": vad.threshold, "prefix_padding_ms": vad.prefix_padding_ms,
            "silence_duration_ms": vad.silence_duration_ms}  # fmt: skip


def parse_event(text: str) -> dict[str, Any]:
    """A client event with a known `type` (anything else: InvalidRequest)."""
    try:
        event = json.loads(text)
    except ValueError:
        raise InvalidRequest("the event is not valid JSON", param="event") from None
    if not isinstance(event, dict):
        raise InvalidRequest("an event is a JSON object with a `type`", param="event")
    if event.get("type") not in CLIENT_EVENTS:
        raise InvalidRequest(
            f"unknown event type {event.get('type')!r}; a transcription session takes: {', '.join(CLIENT_EVENTS)}",
            param="type",
        )
    return event


MAX_APPEND_CHARS = 2 * 1024 * 1024
"""Base64 characters of audio in one append: ~1.5 MB of pcm16, ~32 s at 24 kHz."""
MAX_EVENT_CHARS = MAX_APPEND_CHARS + 64 * 1024
"""Characters of one client event, read before it is parsed."""


def audio_field(event: dict[str, Any]) -> str:
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise InvalidRequest("input_audio_buffer.append needs `audio`: base64 pcm16", param="audio")
    if len(audio) > MAX_APPEND_CHARS:
        raise RequestTooLarge(f"one append may hold at most {MAX_APPEND_CHARS} base64 characters (~30 s of "
                              "24 kHz audio); send smaller appends", param="audio")  # fmt: skip
    return audio


def _parse(model: type[SessionUpdate], data: object, prefix: str) -> SessionUpdate:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        first = max(exc.errors(), key=lambda error: len(error["loc"]))  # a union: the member that got furthest
        where = param_from_loc((prefix, *first["loc"]))
        raise InvalidRequest(f"{where}: {first['msg']}", param=where) from None


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"event_id": f"event_{secrets.token_hex(10)}", "type": kind, **fields}


def error_event(exc: ModelpoolError, client_event_id: str | None = None) -> dict[str, Any]:
    error = error_payload(exc)["error"]
    return server_event("error", error={**error, "event_id": client_event_id})


def render(event: LiveEvent) -> dict[str, Any]:
    transcription = "conversation.item.input_audio_transcription"
    if isinstance(event, SpeechStarted):
        return server_event("input_audio_buffer.speech_started", audio_start_ms=event.audio_start_ms,
                            item_id=event.item_id)  # fmt: skip
    if isinstance(event, SpeechStopped):
        return server_event("input_audio_buffer.speech_stopped", audio_end_ms=event.audio_end_ms,
                            item_id=event.item_id)  # fmt: skip
    if isinstance(event, Committed):
        return server_event("input_audio_buffer.committed", previous_item_id=event.previous_item_id,
                            item_id=event.item_id)  # fmt: skip
    if isinstance(event, TranscriptDelta):
        return server_event(f"{transcription}.delta", item_id=event.item_id, content_index=0, delta=event.delta)
    if isinstance(event, TranscriptCompleted):
        return server_event(f"{transcription}.completed", item_id=event.item_id, content_index=0,
                            transcript=event.transcript)  # fmt: skip
    if isinstance(event, TranscriptFailed):
        return server_event(f"{transcription}.failed", item_id=event.item_id, content_index=0,
                            error=error_payload(event.error)["error"])  # fmt: skip
    assert isinstance(event, Cleared)
    return server_event("input_audio_buffer.cleared")
