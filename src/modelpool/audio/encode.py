"""Speech samples → the bytes of an audio format, chunk by chunk, so a response can
stream: each `encode()` returns what the container has written so far. wav and pcm are
written here; the compressed formats need PyAV (the [audio] extra), imported on first use."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from modelpool.extras import AUDIO

if TYPE_CHECKING:
    import av

FORMATS = ("wav", "pcm", "mp3", "opus", "flac", "aac")
MEDIA_TYPES = {
    "wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg",
    "flac": "audio/flac", "aac": "audio/aac",
}  # fmt: skip


@dataclass(frozen=True)
class _Codec:
    container: str
    codec: str
    sample_format: str
    rate: int | None = None  # None: keep the voice's rate


_CODECS = {
    "mp3": _Codec("mp3", "libmp3lame", "s16p"),
    "opus": _Codec("ogg", "libopus", "s16", rate=48000),  # Opus runs at 48 kHz
    "flac": _Codec("flac", "flac", "s16"),
    "aac": _Codec("adts", "aac", "fltp"),
}


def require_encoder(response_format: str) -> None:
    """Ask before the model speaks: a compressed format without the [audio] extra is a 501
    naming it, while the model's turn is not yet taken."""
    if response_format in _CODECS:
        AUDIO.require()


class AudioEncoder:
    def __init__(self, response_format: str, sample_rate: int) -> None:
        self.format = response_format
        self.sample_rate = sample_rate
        self._started = False
        if response_format in _CODECS:
            AUDIO.require()
            import av

            spec = _CODECS[response_format]
            self._buffer = io.BytesIO()
            self._container = av.open(self._buffer, mode="w", format=spec.container)
            rate = spec.rate or sample_rate
            stream = self._container.add_stream(spec.codec, rate=rate, layout="mono")
            if not isinstance(stream, av.AudioStream):  # an audio codec's name gives an audio stream
                raise TypeError(f"codec {spec.codec!r} made a {type(stream).__name__}, not an audio stream")
            self._stream = stream
            self._resampler = av.AudioResampler(format=spec.sample_format, layout="mono", rate=rate)
            self._sent = 0

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """Bytes for these samples (int16, mono); may be empty while a codec fills a frame."""
        if self.format == "pcm":
            return pcm.astype("<i2").tobytes()
        if self.format == "wav":
            header = b"" if self._started else _wav_header(self.sample_rate)
            self._started = True
            return header + pcm.astype("<i2").tobytes()
        import av  # imported by __init__ for every format that gets here

        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        for resampled in self._resampler.resample(frame):
            self._mux(self._stream.encode(resampled))
        return self._take()

    def finish(self) -> bytes:
        if self.format in ("pcm", "wav"):
            return b"" if self._started or self.format == "pcm" else _wav_header(self.sample_rate)
        for resampled in self._resampler.resample(None):
            self._mux(self._stream.encode(resampled))
        self._mux(self._stream.encode(None))
        self._container.close()
        return self._take()

    def _mux(self, packets: list[av.Packet[av.AudioStream]]) -> None:
        for packet in packets:
            self._container.mux(packet)

    def _take(self) -> bytes:
        data = self._buffer.getvalue()
        new, self._sent = data[self._sent :], len(data)
        return new


def _wav_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum, as streaming
    servers do; players read until the data ends)."""
    unknown = 0xFFFFFFFF
    return b"".join([
        b"RIFF", struct.pack("<I", unknown), b"WAVE",
        b"fmt ", struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16),
        b"data", struct.pack("<I", unknown),
    ])  # fmt: skip
