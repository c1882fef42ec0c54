"""Streaming voice activity detection: Silero VAD (the ONNX model faster-whisper ships)
scores each 32 ms window, and a hysteresis turns scores into speech start / stop.

faster-whisper's `get_speech_timestamps` wants the whole recording and its model object
starts from a fresh LSTM state on every call, so a stream is scored by calling the model on
the new windows plus a second of the audio before them (the state warms up on that
lookback); the decisions are ours: speech starts at the first window at or above
`threshold`, and stops once the score has stayed below `threshold - 0.15` (Silero's own
negative threshold) for `silence_duration_ms`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

VAD_RATE = 16000
WINDOW = 512
"""Samples per scored window at 16 kHz (32 ms): the size Silero VAD was trained on."""
LOOKBACK_WINDOWS = 32

SpeechScorer = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]
"""Whole windows of 16 kHz audio → one speech probability per window."""


@dataclass(frozen=True)
class VadSettings:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    @property
    def negative_threshold(self) -> float:
        return max(self.threshold - 0.15, 0.01)


class Turn(Enum):
    STARTED = "started"
    STOPPED = "stopped"


@dataclass(frozen=True)
class TurnEvent:
    turn: Turn
    sample: int
    """Where it happened, in samples at 16 kHz since the stream began."""


class SileroScorer:
    """Silero VAD scores for a stream, a second of lookback per call (see the module doc)."""

    def __init__(self) -> None:
        self._model: Any = None
        self._history = np.zeros(0, dtype=np.float32)

    def __call__(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self._model is None:
            from faster_whisper.vad import get_vad_model  # heavy (onnxruntime): only when used

            self._model = get_vad_model()
        audio = np.concatenate([self._history, windows])
        scores = np.asarray(self._model(audio), dtype=np.float32).reshape(-1)
        self._history = audio[-LOOKBACK_WINDOWS * WINDOW :]
        return scores[-(len(windows) // WINDOW) :]


class StreamingVad:
    """Feed 16 kHz samples as they come; get the turn events they complete. Scoring runs
    in whole windows, so up to 511 samples wait for the next feed."""

    def __init__(self, settings: VadSettings, score: SpeechScorer | None = None) -> None:
        self.settings = settings
        self._score = score or SileroScorer()
        self._pending = np.zeros(0, dtype=np.float32)
        self._scored = 0
        self.speaking = False
        self._silent_since: int | None = None

    def feed(self, samples: npt.NDArray[np.float32]) -> list[TurnEvent]:
        audio = np.concatenate([self._pending, samples])
        whole = len(audio) // WINDOW * WINDOW
        self._pending = audio[whole:]
        if not whole:
            return []
        events: list[TurnEvent] = []
        for score in self._score(audio[:whole]):
            event = self._step(float(score), self._scored)
            self._scored += WINDOW
            if event is not None:
                events.append(event)
        return events

    def _step(self, score: float, at: int) -> TurnEvent | None:
        if not self.speaking:
            if score >= self.settings.threshold:
                self.speaking, self._silent_since = True, None
                return TurnEvent(Turn.STARTED, at)
            return None
        if score >= self.settings.threshold:
            self._silent_since = None
        elif score < self.settings.negative_threshold and self._silent_since is None:
            self._silent_since = at
        if self._silent_since is not None and at + WINDOW - self._silent_since >= self._silence_samples:
            self.speaking = False
            return TurnEvent(Turn.STOPPED, self._silent_since)
        return None

    @property
    def _silence_samples(self) -> int:
        return self.settings.silence_duration_ms * VAD_RATE // 1000
