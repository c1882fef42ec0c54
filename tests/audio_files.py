"""Audio files that tests upload."""

from __future__ import annotations

import io
import math
import wave


def wav_bytes(rate: int = 16000, seconds: float = 1.0, sample: bytes = b"\x00\x00") -> bytes:
    """A mono 16-bit WAV of `seconds`, every sample the same."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(sample * int(rate * seconds))
    return buffer.getvalue()


def silent_flac(seconds: float, rate: int = 8000) -> bytes:
    """A mono FLAC of `seconds` of digital silence: FLAC packs it into a few bytes a frame,
    so hours fit in a few MB (the audio bomb of issue 27). Made with PyAV, 10 s a frame."""
    import av
    import numpy as np

    buffer = io.BytesIO()
    block = rate * 10
    zeros = np.zeros((1, block), dtype=np.int16)
    with av.open(buffer, mode="w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono")
        for index in range(math.ceil(seconds * rate / block)):
            frame = av.AudioFrame.from_ndarray(zeros[:, : min(block, int(seconds * rate) - index * block)],
                                               format="s16", layout="mono")  # fmt: skip
            frame.sample_rate, frame.pts = rate, index * block
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()
