"""Audio files that tests upload."""

from __future__ import annotations

import io
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
