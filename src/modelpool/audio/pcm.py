"""Live raw audio: base64 chunks of 16-bit little-endian mono PCM (OpenAI's realtime
`pcm16`) → float32 samples at the rate a model wants, resampled as one continuous stream
(PyAV's resampler keeps its filter state between chunks, so chunk edges leave no clicks;
PyAV is the [audio] extra, imported only when a rate needs converting)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelpool.errors import InvalidRequest
from modelpool.extras import AUDIO

if TYPE_CHECKING:
    import av

PCM16_RATES = (16000, 24000)
"""Input rates a live session accepts (OpenAI's pcm16 is 24 kHz)."""


def pcm16_from_base64(data: str, *, param: str = "audio") -> npt.NDArray[np.int16]:
    """The samples of one base64 chunk; a clear InvalidRequest for bad base64 or a byte
    count that is not whole 16-bit samples."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("the audio is not valid base64", param=param) from None
    if len(raw) % 2:
        raise InvalidRequest(
            f"pcm16 audio comes in whole 16-bit samples: {len(raw)} bytes is an odd count", param=param
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.int16, copy=False)


class Pcm16Resampler:
    """int16 chunks at `input_rate` → float32 in [-1, 1) at `output_rate`, one stream."""

    def __init__(self, input_rate: int, output_rate: int) -> None:
        self.input_rate = input_rate
        self.output_rate = output_rate
        self._resampler: av.AudioResampler | None = None
        """Made with the first chunk that needs one: without the [audio] extra, that chunk is
        refused with an error naming it (a live session reports it as an error event)."""

    def convert(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
        if self.input_rate == self.output_rate:
            return pcm.astype(np.float32) / 32768.0
        if not len(pcm):
            return np.zeros(0, dtype=np.float32)
        AUDIO.require()
        import av

        if self._resampler is None:
            self._resampler = av.AudioResampler(format="flt", layout="mono", rate=self.output_rate)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.input_rate
        resampled = self._resampler.resample(frame)
        pieces = [out.to_ndarray().reshape(-1).astype(np.float32, copy=False) for out in resampled]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
