"""Multilingual speech, side by side in one run (run: make bench).

* whisper-base (multilingual): audio seconds transcribed per wall second through modelpool
  (HTTP upload of the same WAV files, auto-detected language) vs faster-whisper called
  directly on the same assembled model folder, at concurrency 1. Target: ≥ 0.95×.
* Kokoro-82M: real-time factor (audio seconds per wall second of synthesis) and the time
  to the first streamed audio byte, for Japanese and for English, streaming a 6-sentence text.
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
from modelpool.config import load_config
from modelpool.config.sources import HubLocation, locate

STT, TTS = "whisper-base", "kokoro-82m"
JAPANESE = ["猫が窓の外を見ています。", "この本はとても面白いです。", "駅はどこですか。"]
ENGLISH = [
    "The weather will be sunny tomorrow morning.",
    "Please bring me two glasses of cold water.",
    "My sister reads a book every night before bed.",
]
SAMPLE_RATE = 24000  # Kokoro's


def pcm_to_wav(pcm: bytes, rate: int) -> bytes:
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return buffer.getvalue()


def speak(url: str, text: str, language: str) -> bytes:
    body = {"model": TTS, "input": text, "response_format": "pcm", "language": language}
    response = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=300)
    response.raise_for_status()
    return response.content


def speech_timing(url: str, text: str, language: str) -> tuple[float, float, float]:
    """(first audio byte s, whole synthesis s, audio s), medians of 3 after a warm-up."""
    body = {"model": TTS, "input": text, "response_format": "pcm", "language": language}
    firsts, wholes, audio = [], [], 0.0
    for attempt in range(4):
        started = time.perf_counter()
        first, size = None, 0
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=300) as response:
            for chunk in response.iter_bytes():
                first = first or time.perf_counter() - started
                size += len(chunk)
        if attempt:  # the first one warms the phonemiser and the model
            firsts.append(first or 0.0)
            wholes.append(time.perf_counter() - started)
            audio = size / 2 / SAMPLE_RATE
    return statistics.median(firsts), statistics.median(wholes), audio


async def transcribe_all(url: str, wavs: list[bytes]) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(wav: bytes) -> None:
            response = await client.post("/v1/audio/transcriptions", data={"model": STT},
                                          files={"file": ("a.wav", wav)})  # fmt: skip
            response.raise_for_status()

        await one(wavs[0])
        started = time.perf_counter()
        for wav in wavs * 2:
            await one(wav)
        return sum(seconds_of(w) for w in wavs * 2) / (time.perf_counter() - started)


def seconds_of(wav: bytes) -> float:
    return (len(wav) - 44) / 2 / SAMPLE_RATE


def direct_rate(wavs: list[bytes]) -> float:
    from faster_whisper import WhisperModel
    from faster_whisper.audio import decode_audio

    config = load_config(None, environ={})
    model_config = next(m for m in config.models.values() if m.id == STT)
    folder = asyncio.run(locate(model_config, HubLocation(work_dir=config.work_dir or HubLocation.work_dir)))
    model = WhisperModel(str(folder), device="cpu", compute_type="int8")
    audios = [decode_audio(io.BytesIO(w)) for w in wavs]
    list(model.transcribe(audios[0], beam_size=1)[0])
    started = time.perf_counter()
    for audio in audios * 2:
        list(model.transcribe(audio, beam_size=1)[0])
    return sum(seconds_of(w) for w in wavs * 2) / (time.perf_counter() - started)


def main() -> None:
    port = free_port()
    with running(serve_argv(port, STT, TTS), f"http://127.0.0.1:{port}/readyz"):
        url = f"http://127.0.0.1:{port}"
        wavs = [pcm_to_wav(speak(url, t, "ja"), SAMPLE_RATE) for t in JAPANESE]
        wavs += [pcm_to_wav(speak(url, t, "en"), SAMPLE_RATE) for t in ENGLISH]
        ours = asyncio.run(transcribe_all(url, wavs))
        tts = {lang: speech_timing(url, " ".join(texts), lang) for lang, texts in (("ja", JAPANESE * 2),
                                                                                  ("en", ENGLISH * 2))}  # fmt: skip
    direct = direct_rate(wavs)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Multilingual speech benchmark {date.today()} — {machine}")
    print()
    print("| measure | modelpool | direct | ratio |")
    print("|---|---|---|---|")
    print(f"| whisper-base, audio s per wall s (3 ja + 3 en, auto-detect) | {ours:.1f} | {direct:.1f} (faster-whisper) "
          f"| {ours / direct:.2f} |")  # fmt: skip
    for lang, (first, whole, audio) in tts.items():
        print(f"| kokoro-82m {lang}, 6 sentences: real-time factor (audio s per synthesis s) | {audio / whole:.1f} "
              "| | |")  # fmt: skip
        print(f"| kokoro-82m {lang}: first audio byte vs whole synthesis | {first * 1000:.0f} ms "
              f"| {whole * 1000:.0f} ms | {first / whole:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
