"""Speech is encoded off the event loop: mp3, aac or opus of a long chunk of audio costs
seconds of CPU, which on the loop would hold every other request."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt

from modelpool.audio.encode import AudioEncoder
from modelpool.wire.openai.speech import encoded_speech


class RecordingEncoder(AudioEncoder):
    """An encoder that notes the thread each call runs on."""

    threads: list[int]

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        self.threads.append(threading.get_ident())
        return super().encode(pcm)

    def finish(self) -> bytes:
        self.threads.append(threading.get_ident())
        return super().finish()


async def test_each_chunk_is_encoded_off_the_event_loop_in_order() -> None:
    encoder = RecordingEncoder("pcm", 22050)
    encoder.threads = []

    async def audio() -> AsyncIterator[npt.NDArray[np.int16]]:
        for value in (1, 2, 3):
            yield np.full(2205, value, dtype=np.int16)

    data = b"".join([chunk async for chunk in encoded_speech(audio(), encoder)])
    assert np.array_equal(np.frombuffer(data, dtype=np.int16), np.repeat([1, 2, 3], 2205))
    assert len(encoder.threads) == 4 and threading.get_ident() not in encoder.threads
