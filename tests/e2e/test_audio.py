"""Speech through the official openai SDK: Piper speaks, Whisper transcribes it back."""

from __future__ import annotations

import io
import wave
from typing import Literal

import httpx
import openai
import pytest

from tests.audio_files import wav_bytes
from tests.conftest import CHAT_MODEL, KOKORO_MODEL, STT_MODEL, TTS_MODEL, serving
from tests.speech_metrics import word_error_rate

SENTENCES = "The quick brown fox jumps over the lazy dog. It was a sunny day in the city. We walked to the park."


Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


async def speak(oai: openai.AsyncOpenAI, text: str, fmt: Format) -> bytes:
    reply = await oai.audio.speech.create(
        model=TTS_MODEL, voice="alloy", input=text, response_format=fmt, extra_body={"deterministic": True}
    )
    return reply.content


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
async def test_round_trip_in_every_format(oai: openai.AsyncOpenAI, fmt: Format) -> None:
    audio = await speak(oai, SENTENCES, fmt)
    transcript = await oai.audio.transcriptions.create(model=STT_MODEL, file=(f"speech.{fmt}", audio))
    assert word_error_rate(SENTENCES, transcript.text) <= 0.10, transcript.text


async def test_pcm_is_raw_16_bit_at_the_voice_rate(oai: openai.AsyncOpenAI) -> None:
    pcm = await speak(oai, "Hello there.", "pcm")
    wav = await speak(oai, "Hello there.", "wav")
    assert wav[44:] == pcm  # the same samples behind a 44-byte header
    with wave.open(io.BytesIO(wav[:44] + pcm)) as reader:
        assert reader.getframerate() == 22050 and reader.getsampwidth() == 2 and reader.getnchannels() == 1


async def test_deterministic_speech_is_repeatable(oai: openai.AsyncOpenAI) -> None:
    assert await speak(oai, "Same words, same sound.", "wav") == await speak(oai, "Same words, same sound.", "wav")


# The openai SDK marks audio.translations deprecated; it is an endpoint this server serves.
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
async def test_response_formats(oai: openai.AsyncOpenAI) -> None:
    audio = ("speech.wav", await speak(oai, SENTENCES, "wav"))
    text = await oai.audio.transcriptions.create(model=STT_MODEL, file=audio, response_format="text")
    assert word_error_rate(SENTENCES, text) <= 0.10 and text.endswith("\n")
    srt = await oai.audio.transcriptions.create(model=STT_MODEL, file=audio, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> ") and "-->" in srt
    vtt = await oai.audio.transcriptions.create(model=STT_MODEL, file=audio, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ")
    verbose = await oai.audio.transcriptions.create(
        model=STT_MODEL, file=audio, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert verbose.duration > 3 and verbose.segments and verbose.segments[0].start == 0
    assert verbose.words is not None
    assert [w.word.lower().strip(".,") for w in verbose.words[:3]] == ["the", "quick", "brown"]
    assert all(w.end >= w.start for w in verbose.words)
    translated = await oai.audio.translations.create(model=STT_MODEL, file=audio)
    assert word_error_rate(SENTENCES, translated.text) <= 0.10


async def test_streamed_transcription_and_speech(oai: openai.AsyncOpenAI) -> None:
    audio = ("speech.wav", await speak(oai, SENTENCES, "wav"))
    events = [e async for e in await oai.audio.transcriptions.create(model=STT_MODEL, file=audio, stream=True)]
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and events[-1].type == "transcript.text.done"
    assert "".join(deltas).strip() == events[-1].text
    async with oai.audio.speech.with_streaming_response.create(
        model=TTS_MODEL, voice="alloy", input=SENTENCES, response_format="pcm", extra_body={"deterministic": True}
    ) as response:
        chunks = [chunk async for chunk in response.iter_bytes(None)]
    # (in-process transport buffers; test_server_process.py sees the chunks arrive apart)
    assert b"".join(chunks) == await speak(oai, SENTENCES, "pcm")


async def test_speech_as_server_sent_events(http: httpx.AsyncClient, oai: openai.AsyncOpenAI) -> None:
    import base64
    import json

    body = {
        "model": TTS_MODEL,
        "input": SENTENCES,
        "response_format": "pcm",
        "stream_format": "sse",
        "deterministic": True,
    }
    response = await http.post("/v1/audio/speech", json=body)
    events = [json.loads(e[len("data: ") :]) for e in response.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == await speak(oai, SENTENCES, "pcm")


async def test_voices_and_pool_listing(http: httpx.AsyncClient) -> None:
    voices = (await http.get("/v1/audio/voices")).json()["data"]
    assert [v for v in voices if v["model"] == TTS_MODEL] == [
        {"model": TTS_MODEL, "voice": TTS_MODEL, "language": "en_US", "sample_rate": 22050, "speaker_id": None}
    ]
    listed = {m["id"]: m for m in (await http.get("/v1/admin/models")).json()["data"]}
    assert listed[STT_MODEL]["tasks"] == ["transcription"] and listed[TTS_MODEL]["tasks"] == ["speech"]
    metrics = (await http.get("/metrics")).text
    assert 'modelpool_audio_seconds_total{direction="in",model="whisper-tiny.en"}' in metrics
    assert "modelpool_real_time_factor_bucket" in metrics


async def test_voices_honour_their_model_filter(http: httpx.AsyncClient) -> None:
    """`GET /v1/audio/voices?model=` lists that model's voices only (issue 31: the simple
    inference server's clients filter so); unknown → 404, not a speech model → 400."""
    everyone = (await http.get("/v1/audio/voices")).json()["data"]
    assert {v["model"] for v in everyone} >= {TTS_MODEL, KOKORO_MODEL}
    piper = (await http.get("/v1/audio/voices", params={"model": TTS_MODEL})).json()["data"]
    assert piper == [v for v in everyone if v["model"] == TTS_MODEL] and len(piper) == 1
    kokoro = (await http.get("/v1/audio/voices", params={"model": KOKORO_MODEL})).json()["data"]
    assert kokoro and {v["model"] for v in kokoro} == {KOKORO_MODEL}
    unknown = await http.get("/v1/audio/voices", params={"model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    mute = await http.get("/v1/audio/voices", params={"model": STT_MODEL})
    assert mute.status_code == 400 and mute.json()["error"]["param"] == "model"
    for bad in ("", "x" * 257):
        refused = await http.get("/v1/audio/voices", params={"model": bad})
        assert refused.status_code == 400, refused.text


@pytest.mark.parametrize(
    ("data", "fields", "param"),
    [
        (b"this is not audio at all", {}, "file"),
        (b"", {}, "file"),
        (None, {"language": "fr"}, "language"),
        (None, {"response_format": "docx"}, "response_format"),
        (None, {"temperature": "7"}, "temperature"),
        (None, {"response_format": "json", "timestamp_granularities[]": "word"}, "timestamp_granularities"),
        (None, {"model": TTS_MODEL}, "model"),
        (None, {"model": "no-such-model"}, "model"),
    ],
)
async def test_bad_transcription_requests(
    http: httpx.AsyncClient, data: bytes | None, fields: dict, param: str
) -> None:
    form = {"model": STT_MODEL, **fields}
    response = await http.post(
        "/v1/audio/transcriptions", data=form, files={"file": ("a.wav", wav_bytes() if data is None else data)}
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "x" * 5000}, "input"),
        ({"speed": 5}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"model": CHAT_MODEL}, "model"),
        ({"instructions": "whisper it"}, "instructions"),
    ],
)
async def test_bad_speech_requests(http: httpx.AsyncClient, fields: dict, param: str) -> None:
    response = await http.post("/v1/audio/speech", json={"model": TTS_MODEL, "input": "Hi.", **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_an_upload_over_the_limit_is_413() -> None:
    cli = {"enabled_models": [STT_MODEL], "server": {"max_upload_bytes": 50_000}}
    async with serving(cli) as (_, client):
        response = await client.post(
            "/v1/audio/transcriptions", data={"model": STT_MODEL}, files={"file": ("big.wav", b"\x00" * 60_000)}
        )
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
        ok = await client.post(
            "/v1/audio/transcriptions", data={"model": STT_MODEL}, files={"file": ("a.wav", wav_bytes())}
        )
        assert ok.status_code == 200


def transcode(wav: bytes, container: str, codec: str, rate: int) -> bytes:
    """The same speech in another container, as a phone or a browser would upload it."""
    import av

    source = av.open(io.BytesIO(wav))
    assert isinstance(source, av.container.InputContainer)
    out_buffer = io.BytesIO()
    with av.open(out_buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        assert isinstance(stream, av.AudioStream) and stream.codec_context.codec.audio_formats is not None
        resampler = av.AudioResampler(format=stream.codec_context.codec.audio_formats[0].name, layout="mono", rate=rate)
        for frame in source.decode(audio=0):
            for resampled in resampler.resample(frame):
                for packet in stream.encode(resampled):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return out_buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "container", "codec", "rate"),
    [("speech.m4a", "mp4", "aac", 22050), ("speech.webm", "webm", "libopus", 48000)],
)
async def test_m4a_and_webm_uploads(oai: openai.AsyncOpenAI, name: str, container: str, codec: str, rate: int):
    audio = transcode(await speak(oai, SENTENCES, "wav"), container, codec, rate)
    transcript = await oai.audio.transcriptions.create(model=STT_MODEL, file=(name, audio))
    assert word_error_rate(SENTENCES, transcript.text) <= 0.10, transcript.text


async def test_speed_changes_the_length(oai: openai.AsyncOpenAI) -> None:
    async def seconds(speed: float) -> float:
        reply = await oai.audio.speech.create(
            model=TTS_MODEL,
            voice="alloy",
            input=SENTENCES,
            response_format="pcm",
            speed=speed,
            extra_body={"deterministic": True},
        )
        return len(reply.content) / 2 / 22050

    normal, fast, slow = await seconds(1.0), await seconds(2.0), await seconds(0.5)
    # Speech scales with 1/speed; the pauses between sentences do not, so not exactly.
    assert fast < 0.7 * normal and slow > 1.6 * normal
