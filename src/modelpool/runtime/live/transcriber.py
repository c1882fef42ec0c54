"""Live transcription as a library: audio arrives in chunks, a VAD cuts it into utterances,
each utterance is transcribed again every `partial_interval_s` of new audio while it grows
(settled words go out as deltas) and once more, whole, when it ends.

Every transcription goes through the pool (queue, keep-alive, metrics) and is awaited
before the next chunk is taken: a client that sends faster than the model keeps up is
slowed by whoever feeds `append` (the API stops reading its socket), never buffered.
Cancelling `append` closes the transcription's stream, which gives the model back at once.
"""

from __future__ import annotations

import asyncio
import secrets

import numpy as np
import numpy.typing as npt

from modelpool.audio.vad import VAD_RATE, SpeechScorer, StreamingVad, Turn, TurnEvent, VadSettings
from modelpool.errors import AudioTooLong, CommitEmpty, InvalidRequest, ModelpoolError
from modelpool.inference import TranscriptionRequest
from modelpool.pool_api import PoolApi
from modelpool.pool_api.call import CallOptions
from modelpool.pool_api.live import (
    Cleared,
    Committed,
    Emit,
    LiveSessions,
    LiveSettings,
    SpeechStarted,
    SpeechStopped,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
)
from modelpool.pool_api.results import charge
from modelpool.pool_api.usage import UsageMeter
from modelpool.runtime.live.agreement import LocalAgreement

MAX_UTTERANCE_S = 30.0
"""An utterance this long is committed even while speech goes on (Whisper's window)."""


def new_item_id() -> str:
    return f"item_{secrets.token_hex(10)}"


class LiveTranscriber:
    """One session's audio: feed `append` 16 kHz float32 chunks in order, from one task.
    A session takes at most `max_seconds` of audio in all (None: no limit); the chunk that
    would pass it, and every chunk after, is refused with AudioTooLong."""

    def __init__(
        self,
        pool: PoolApi,
        emit: Emit,
        *,
        options: CallOptions | None = None,
        scorer: SpeechScorer | None = None,
        max_seconds: float | None = None,
        meter: UsageMeter | None = None,
    ) -> None:
        """`meter`: the session's, charged every transcription's usage."""
        self.pool = pool
        self.meter = meter
        self.max_seconds = max_seconds
        self._received = 0
        """Samples this session has sent in all (a refused chunk's included)."""
        self.options = options or CallOptions()
        self.settings = LiveSettings()
        self._emit = emit
        self._scorer = scorer
        self._vad: StreamingVad | None = None
        self._audio = np.zeros(0, dtype=np.float32)
        self._audio_start = 0
        """The stream position (samples) of `_audio[0]`."""
        self._utterance_start: int | None = None
        self._item_id = new_item_id()
        self._previous_item: str | None = None
        self._agreement = LocalAgreement()
        self._partial_at = 0
        self._vad_origin = 0

    def configure(self, settings: LiveSettings) -> None:
        """New settings; a model is checked here (unknown, or not one that transcribes: the
        pool's error). A new VAD starts when its settings change."""
        if settings.model is not None and self.pool.transcription_rate(settings.model, self.options) != VAD_RATE:
            raise InvalidRequest(f"live transcription needs a {VAD_RATE} Hz model", param="model")
        if settings.turn_detection != self.settings.turn_detection or self._vad is None:
            self._new_vad(settings.turn_detection)
        self.settings = settings

    async def append(self, samples: npt.NDArray[np.float32]) -> None:
        if self.settings.model is None:
            raise InvalidRequest(
                "no transcription model: send transcription_session.update with input_audio_transcription.model",
                param="session.input_audio_transcription.model",
            )
        self._accept(len(samples))
        self._audio = np.concatenate([self._audio, samples])
        if self._vad is None:
            self._utterance_start = self._audio_start if self._utterance_start is None else self._utterance_start
        else:
            for event in await asyncio.to_thread(self._vad.feed, samples):
                await self._turn(event)
        if self._utterance_start is not None:
            await self._grow()
        else:
            self._keep_prefix()

    def _accept(self, count: int) -> None:
        """Count `count` more samples against the session's limit, or refuse them (they
        count too: once over, every later chunk is refused)."""
        self._received += count
        if self.max_seconds is not None and self._received > self.max_seconds * VAD_RATE:
            raise AudioTooLong(
                f"this session has sent the {self.max_seconds:g} s of audio a live session may "
                "(server.max_audio_seconds); open a new session to go on",
                param="audio",
            )

    async def commit(self) -> None:
        """End the current utterance now (`input_audio_buffer.commit`)."""
        if self._utterance_start is None or self._end() - self._utterance_start < VAD_RATE // 10:
            raise CommitEmpty("no utterance to commit: the buffer holds less than 100 ms of speech", param=None)
        await self._finish(self._end())

    async def clear(self) -> None:
        """Drop the audio not yet committed (`input_audio_buffer.clear`)."""
        self._audio_start, self._audio = self._end(), np.zeros(0, dtype=np.float32)
        self._utterance_start = None
        self._agreement, self._partial_at = LocalAgreement(), 0
        if self._vad is not None:
            self._new_vad(self._vad.settings)
        await self._emit(Cleared())

    def _new_vad(self, settings: VadSettings | None) -> None:
        """A VAD counts samples from its own start: remember where that is in the stream."""
        self._vad = None if settings is None else StreamingVad(settings, self._scorer)
        self._vad_origin = self._end()

    async def _turn(self, event: TurnEvent) -> None:
        sample = self._vad_origin + event.sample  # a position in the whole stream
        if event.turn is Turn.STARTED:
            padding = self.settings.turn_detection.prefix_padding_ms if self.settings.turn_detection else 0
            self._utterance_start = max(self._audio_start, sample - padding * VAD_RATE // 1000)
            self._partial_at = self._utterance_start
            await self._emit(SpeechStarted(self._item_id, _ms(sample)))
        elif self._utterance_start is not None:
            await self._emit(SpeechStopped(self._item_id, _ms(sample)))
            await self._finish(self._end())

    async def _grow(self) -> None:
        assert self._utterance_start is not None
        end = self._end()
        if end - self._utterance_start >= MAX_UTTERANCE_S * VAD_RATE:
            if self._vad is not None:
                await self._emit(SpeechStopped(self._item_id, _ms(end)))
            await self._finish(end)
            if self._vad is not None and self._vad.speaking:  # speech goes on: so does a new utterance
                self._utterance_start = self._partial_at = end
                await self._emit(SpeechStarted(self._item_id, _ms(end)))
        elif end - self._partial_at >= self.settings.partial_interval_s * VAD_RATE:
            self._partial_at = end
            delta = self._agreement.partial(await self._transcribe(self._utterance_start, end))
            if delta:
                await self._emit(TranscriptDelta(self._item_id, delta))

    async def _finish(self, end: int) -> None:
        assert self._utterance_start is not None
        start, item, previous = self._utterance_start, self._item_id, self._previous_item
        self._utterance_start, self._previous_item, self._item_id = None, item, new_item_id()
        agreement, self._agreement = self._agreement, LocalAgreement()
        await self._emit(Committed(item, previous))
        try:
            transcript = await self._transcribe(start, end)
        except ModelpoolError as exc:
            await self._emit(TranscriptFailed(item, exc))
            return
        finally:
            self._keep_prefix()
        tail = agreement.final(transcript)
        if tail:
            await self._emit(TranscriptDelta(item, tail))
        await self._emit(TranscriptCompleted(item, transcript))

    async def _transcribe(self, start: int, end: int) -> str:
        assert self.settings.model is not None
        audio = self._audio[start - self._audio_start : end - self._audio_start]
        job = TranscriptionRequest(language=self.settings.language, prompt=self.settings.prompt)
        transcription = await self.pool.transcribe_samples(self.settings.model, audio, job, self.options)
        charge(self.meter, transcription)
        async with transcription.segments as segments:
            return "".join([segment.text async for segment in segments]).strip()

    def _keep_prefix(self) -> None:
        """Outside an utterance keep only what a next one's prefix padding may take."""
        padding = self.settings.turn_detection.prefix_padding_ms if self.settings.turn_detection else 0
        keep = padding * VAD_RATE // 1000 + VAD_RATE // 10
        if self._utterance_start is None and len(self._audio) > keep:
            self._audio_start += len(self._audio) - keep
            self._audio = self._audio[-keep:]

    def _end(self) -> int:
        return self._audio_start + len(self._audio)


def _ms(sample: int) -> int:
    return sample * 1000 // VAD_RATE


_CHECKED: LiveSessions = LiveTranscriber  # mypy checks here that the class opens `LiveSessions`
