"""Audio for the live-transcription tests: Piper's speech at the rate a realtime client
sends (resampled here with PyAV, independently of the server's own resampler), silence,
and 100 ms chunks."""

from __future__ import annotations

import av
import httpx
import numpy as np
from fastapi import FastAPI

CHUNK_S = 0.1
PIPER_RATE = 22050


async def speech_at(app: FastAPI, model: str, text: str, rate: int) -> bytes:
    """`text` spoken by Piper (deterministic), as mono pcm16 at `rate`."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=120) as http:
        body = {"model": model, "input": text, "response_format": "pcm", "deterministic": True}
        response = await http.post("/v1/audio/speech", json=body)
    response.raise_for_status()
    return resample_pcm16(response.content, PIPER_RATE, rate)


def resample_pcm16(pcm: bytes, source_rate: int, rate: int) -> bytes:
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = source_rate
    out = [*resampler.resample(frame), *resampler.resample(None)]
    return b"".join(piece.to_ndarray().astype("<i2").tobytes() for piece in out)


def silence(seconds: float, rate: int) -> bytes:
    return b"\x00\x00" * int(seconds * rate)


def chunks_of(pcm: bytes, rate: int) -> list[bytes]:
    size = int(rate * CHUNK_S) * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]
