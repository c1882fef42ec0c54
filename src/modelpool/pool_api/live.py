"""Live transcription as the API sees it: the session settings, the events a session emits,
and the session itself (a Protocol: the runtime's `LiveTranscriber` is one). The server
root hands the routes a `LiveSessions` factory, so the realtime route never imports the
runtime."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from modelpool.audio.vad import VadSettings
from modelpool.errors import ModelpoolError
from modelpool.pool_api import PoolApi
from modelpool.pool_api.usage import UsageMeter


@dataclass(frozen=True)
class LiveSettings:
    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    turn_detection: VadSettings | None = field(default_factory=VadSettings)
    """None: no VAD; the client commits each utterance itself."""
    partial_interval_s: float = 0.75


@dataclass(frozen=True)
class SpeechStarted:
    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class Committed:
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True)
class TranscriptDelta:
    item_id: str
    delta: str


@dataclass(frozen=True)
class TranscriptCompleted:
    item_id: str
    transcript: str


@dataclass(frozen=True)
class TranscriptFailed:
    item_id: str
    error: ModelpoolError


@dataclass(frozen=True)
class Cleared:
    """The uncommitted audio was dropped (`input_audio_buffer.cleared`); it carries nothing else."""


LiveEvent = (
    SpeechStarted | SpeechStopped | Committed | TranscriptDelta | TranscriptCompleted | TranscriptFailed | Cleared
)
Emit = Callable[[LiveEvent], Awaitable[None]]


class LiveSession(Protocol):
    """One session's audio: `append` 16 kHz float32 chunks in order, from one task."""

    def configure(self, settings: LiveSettings) -> None: ...
    async def append(self, samples: npt.NDArray[np.float32]) -> None: ...
    async def commit(self) -> None: ...
    async def clear(self) -> None: ...


class LiveSessions(Protocol):
    """Opens a session over `pool` that emits its events through `emit`, takes at most
    `max_seconds` of audio (None: no limit) and charges its transcriptions to `meter`."""

    def __call__(
        self, pool: PoolApi, emit: Emit, *, max_seconds: float | None = None, meter: UsageMeter | None = None
    ) -> LiveSession: ...
