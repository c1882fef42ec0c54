"""The pool's audio requests: transcription (of an upload, or of samples already decoded, as
live transcription sends them) and speech, each a stream on one turn of the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from modelpool.audio.decode import count_audio, fill_audio
from modelpool.backends.base import (
    SpeechBackend,
    TranscriptionBackend,
)
from modelpool.errors import UnsupportedTask
from modelpool.inference import (
    SpeechRequest,
    TranscriptionRequest,
)
from modelpool.offload import AUDIO_DECODES
from modelpool.pool_api.call import DEFAULT_CALL, CallOptions
from modelpool.pool_api.results import (
    ModelVoice,
    SpeechAudio,
    Transcription,
)
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.lease import open_stream
from modelpool.runtime.pool_base import PoolBase
from modelpool.tasks import Task

DEFAULT_AUDIO_WAIT_S = 120.0
"""How long a transcription waits for its share of the decoded-audio budget when the pool
sets no model wait."""


class AudioRequests(PoolBase):
    async def transcribe(
        self, name: str, upload: bytes, request: TranscriptionRequest, options: CallOptions = DEFAULT_CALL
    ) -> Transcription:
        """Decode `upload` at the rate the model declares, then its transcript's segments as
        they are decoded, on one turn of the model. Bad audio is a 400 before any waiting."""
        rate = self.transcription_rate(name, options)
        length = await AUDIO_DECODES.run(count_audio, upload, rate, self.max_audio_seconds)
        release = await self._hold_decoded(length / rate)
        try:
            audio = await AUDIO_DECODES.run(fill_audio, upload, rate, length)
            return await self.transcribe_samples(name, audio, request, options, on_close=release)
        except BaseException:
            release()
            raise

    async def _hold_decoded(self, seconds: float) -> Callable[[], None]:
        """A share of the server's decoded-audio budget, held until the transcript closes."""
        if self.audio_budget is None:
            return lambda: None
        wait_s = self.model_wait_s if self.model_wait_s is not None else DEFAULT_AUDIO_WAIT_S
        return await self.audio_budget.take(seconds, wait_s)

    def transcription_rate(self, name: str, options: CallOptions = DEFAULT_CALL) -> int:
        """The sample rate the transcription model `name` wants its audio at (raises
        ModelNotFound / UnsupportedTask for a model that cannot transcribe)."""
        rate = self.slot_for(name, Task.TRANSCRIPTION, options).capabilities.declared.audio_input_rate
        assert rate is not None, "the registry refuses a transcription backend that declares no input rate"
        return rate

    async def transcribe_samples(
        self, name: str, audio: npt.NDArray[np.float32], request: TranscriptionRequest,
        options: CallOptions = DEFAULT_CALL, on_close: Callable[[], None] | None = None,
    ) -> Transcription:  # fmt: skip
        """As `transcribe`, for mono float32 samples already at `transcription_rate(name)`;
        `on_close` runs when the transcript's stream closes."""
        slot = self.slot_for(name, Task.TRANSCRIPTION, options)
        rate = self.transcription_rate(name, options)
        job = replace(request, audio=audio)
        audio_s = len(audio) / rate
        lease = await slot.lease(TranscriptionBackend, self.model_wait_s, options.keep_alive, schedule=options.schedule)
        usage = RequestUsage()
        observed = self.observe.audio(slot.id, "transcription", lambda: audio_s, usage)

        def closed(timing: RequestTiming) -> None:
            observed(timing)
            if on_close is not None:
                on_close()

        segments = await open_stream(lease, lambda backend: backend.transcribe(job), on_close=closed, usage=usage)
        return Transcription(segments, audio_s)

    async def speak(self, name: str, request: SpeechRequest, options: CallOptions = DEFAULT_CALL) -> SpeechAudio:
        """Speech, a sentence of samples at a time, on one turn of the model."""
        lease = await self.lease(name, Task.SPEECH, SpeechBackend, options)
        rate = lease.backend.sample_rate
        produced = [0]

        def count(pcm: npt.NDArray[np.int16]) -> None:
            produced[0] += len(pcm)

        usage = RequestUsage()
        on_close = self.observe.audio(lease.model_id, "speech", lambda: produced[0] / rate, usage)
        chunks = await open_stream(
            lease, lambda backend: backend.synthesize(request), observe=count, on_close=on_close, usage=usage
        )
        return SpeechAudio(chunks, rate)

    async def voices(self, name: str | None = None) -> list[ModelVoice]:
        """The voices of every text-to-speech model (or of the one `name` names: 404 if
        unknown, 400 if it does not speak), read from each model's files by a backend that
        is never started: listing voices loads and evicts nothing."""
        listed = []
        slots = list(self._slots.values()) if name is None else [self.slot(name)]
        if name is not None and Task.SPEECH not in slots[0].tasks:
            why = f"model '{slots[0].id}' is not a text-to-speech model: it has no voices"
            raise UnsupportedTask(why, param="model")
        for slot in slots:
            if Task.SPEECH in slot.tasks:
                listed += [ModelVoice(slot.id, voice) for voice in await slot.voices()]
        return listed
