"""Kokoro-82M (the `kokoro` backend) on its real int8 weights: Japanese and English speech,
voices, speed, streaming, every output format, bad input, and round trips through Whisper."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from tests.conftest import KOKORO_MODEL, MULTILINGUAL_STT_MODEL, STT_MODEL, serving
from tests.speech_metrics import character_error_rate, word_error_rate

RATE = 24000
VOICES = ["jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"]
JAPANESE = ["私は毎朝新聞を読みます。", "東京駅で友達に会いました。", "日本語の勉強は楽しいです。"]
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "We bought 3 apples at the market.",
    "Please close the window before you leave.",
]


@pytest.fixture(scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An app with Kokoro and the two Whisper models (all load on first use)."""
    async with serving({"enabled_models": [KOKORO_MODEL, STT_MODEL, MULTILINGUAL_STT_MODEL]}) as (_, client):
        yield client


async def speak(http: httpx.AsyncClient, text: str, fmt: str = "pcm", **fields: object) -> bytes:
    body = {"model": KOKORO_MODEL, "input": text, "response_format": fmt, **fields}
    response = await http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    return response.content


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype=np.int16).astype(np.float32)


def assert_speech(pcm: bytes, low_s: float, high_s: float) -> None:
    """Real audio: as long as the text needs, loud enough, and not one tone."""
    audio = samples(pcm)
    assert low_s <= len(audio) / RATE <= high_s, len(audio) / RATE
    assert np.sqrt(np.mean(audio**2)) > 300 and np.abs(audio).max() > 3000
    frames = audio[: len(audio) // 480 * 480].reshape(-1, 480)  # 20 ms frames: pauses between syllables
    loudness = np.sqrt(np.mean(frames**2, axis=1))
    assert (loudness < 0.1 * loudness.max()).any() and (loudness > 0.3 * loudness.max()).mean() > 0.3


def decoded_seconds(data: bytes) -> float:
    import av

    with av.open(io.BytesIO(data)) as container:
        assert isinstance(container, av.container.InputContainer)
        frames = [frame for frame in container.decode(audio=0)]
    return sum(frame.samples for frame in frames) / frames[0].sample_rate


async def transcribe(http: httpx.AsyncClient, model: str, wav: bytes, **fields: str) -> str:
    response = await http.post(
        "/v1/audio/transcriptions", data={"model": model, **fields}, files={"file": ("kokoro.wav", wav)}
    )
    assert response.status_code == 200, response.text
    return str(response.json()["text"])


async def test_voices_are_listed_with_the_language_they_were_made_for(http: httpx.AsyncClient) -> None:
    listed = (await http.get("/v1/audio/voices")).json()["data"]
    kokoro = [(v["voice"], v["language"], v["sample_rate"]) for v in listed if v["model"] == KOKORO_MODEL]
    assert kokoro == [(voice, "ja", RATE) for voice in VOICES]
    model = (await http.get(f"/v1/models/{KOKORO_MODEL}")).json()
    assert model["capabilities"]["languages"] == ["en", "en-gb", "en-us", "ja"], model


@pytest.mark.parametrize("sentence", JAPANESE)
async def test_japanese_sentences_are_spoken(http: httpx.AsyncClient, sentence: str) -> None:
    assert_speech(
        await speak(http, sentence, voice="jf_alpha", language="ja"), 0.08 * len(sentence), 0.35 * len(sentence)
    )


@pytest.mark.parametrize("sentence", ENGLISH)
async def test_english_sentences_are_spoken(http: httpx.AsyncClient, sentence: str) -> None:
    count = len(sentence.split())
    assert_speech(await speak(http, sentence, voice="jm_kumo", language="en"), 0.2 * count, 0.8 * count)


async def test_voices_differ_and_a_voice_repeats_itself(http: httpx.AsyncClient) -> None:
    text = JAPANESE[0]
    spoken = {voice: await speak(http, text, voice=voice) for voice in ("jf_alpha", "jm_kumo", "jf_nezumi")}
    assert len(set(spoken.values())) == 3
    assert await speak(http, text, voice="jm_kumo") == spoken["jm_kumo"]


async def test_the_language_picks_the_phonemiser(http: httpx.AsyncClient) -> None:
    """A Japanese voice reads English with the English phonemiser when asked (`lang` works too)."""
    english = await speak(http, ENGLISH[0], voice="jf_alpha", lang="en-us")
    assert english == await speak(http, ENGLISH[0], voice="jf_alpha", language="en")
    assert english != await speak(http, ENGLISH[0], voice="jf_alpha")  # the voice's own: Japanese


async def test_speed_changes_the_length(http: httpx.AsyncClient) -> None:
    async def seconds(speed: float) -> float:
        return len(await speak(http, ENGLISH[0], voice="jm_kumo", language="en", speed=speed)) / 2 / RATE

    normal, fast, slow = await seconds(1.0), await seconds(2.0), await seconds(0.5)
    assert fast < 0.7 * normal and slow > 1.6 * normal, (normal, fast, slow)


async def test_a_sentence_at_a_time(http: httpx.AsyncClient) -> None:
    body = {"model": KOKORO_MODEL, "input": "".join(JAPANESE), "response_format": "pcm", "stream_format": "sse"}
    response = await http.post("/v1/audio/speech", json=body)
    events = [json.loads(e[len("data: ") :]) for e in response.text.split("\n\n") if e.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(JAPANESE) and events[-1]["type"] == "speech.audio.done"
    assert b"".join(deltas) == await speak(http, "".join(JAPANESE))


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
async def test_every_format_decodes(http: httpx.AsyncClient, fmt: str) -> None:
    text = ENGLISH[2]
    pcm_seconds = len(await speak(http, text, voice="jf_tebukuro", language="en")) / 2 / RATE
    assert decoded_seconds(await speak(http, text, fmt, voice="jf_tebukuro", language="en")) == pytest.approx(
        pcm_seconds, abs=0.1
    )


@pytest.mark.parametrize(
    ("fields", "param", "named"),
    [
        ({"voice": "alloy"}, "voice", VOICES),
        ({"voice": "af_heart"}, "voice", VOICES),
        ({"language": "fr"}, "language", ["'fr'", "ja", "en-us"]),
        ({"lang": "klingon"}, "language", ["'klingon'"]),
        ({"input": "!!! ???", "language": "en"}, "input", ["nothing"]),
        ({"input": "♪ ♪", "language": "ja"}, "input", ["nothing"]),
        ({"input": "ーォ", "language": "ja"}, "input", ["phonemiser cannot read"]),  # pyopenjtalk's reading raises
        ({"input": "Hi. ーォ", "language": "ja"}, "input", ["phonemiser cannot read"]),  # before any audio
        ({"speed": 3.0}, "speed", ["0.5", "2.0"]),
        ({"input": "あ" * 5000}, "input", ["4096"]),
    ],
)
async def test_bad_input(http: httpx.AsyncClient, fields: dict[str, object], param: str, named: list[str]) -> None:
    body = {"model": KOKORO_MODEL, "input": "こんにちは。", **fields}
    response = await http.post("/v1/audio/speech", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and all(name in error["message"] for name in named), error


@pytest.mark.parametrize("model", [MULTILINGUAL_STT_MODEL, STT_MODEL])
async def test_english_round_trip_through_whisper(http: httpx.AsyncClient, model: str) -> None:
    wav = await speak(http, " ".join(ENGLISH), "wav", voice="jm_kumo", language="en")
    heard = await transcribe(http, model, wav)
    assert word_error_rate(" ".join(ENGLISH), heard) <= 0.10, heard


@pytest.mark.parametrize("sentence", JAPANESE)
async def test_japanese_round_trip_through_multilingual_whisper(http: httpx.AsyncClient, sentence: str) -> None:
    heard = await transcribe(
        http, MULTILINGUAL_STT_MODEL, await speak(http, sentence, "wav", voice="jf_alpha"), language="ja"
    )
    assert character_error_rate(sentence, heard) <= 0.10, heard
