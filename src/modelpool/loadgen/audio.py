"""The default audio for transcription runs: a short spoken-band tone, made here (no file to
ship). A server transcribes it to little or nothing; the cost measured is decoding, the
encoder and one short decode, which is what a load test of the route needs."""

from __future__ import annotations

import io
import math
import struct
import wave

RATE = 16_000


def tone_wav(seconds: float = 1.0, hz: float = 220.0) -> bytes:
    """16 kHz mono 16-bit PCM: a tone whose loudness rises and falls like a syllable."""
    frames = int(RATE * seconds)
    samples = (
        int(8000 * math.sin(math.pi * i / frames) * math.sin(2 * math.pi * hz * i / RATE)) for i in range(frames)
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(b"".join(struct.pack("<h", s) for s in samples))
    return out.getvalue()
