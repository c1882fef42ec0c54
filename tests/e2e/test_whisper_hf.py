"""Hugging Face-format Whispers (tests/whisper_hf.py) served by faster_whisper with no
`backend:` named, through the official `openai` SDK. The tiny random one: detected,
converted to CTranslate2 once (float32), token for token what transformers' own `generate`
decodes from the same features; unloaded and loaded again without converting. tiny.en's
real weights written in Hugging Face format: converted at the default int8, it hears the
starter Piper voice word for word, as transformers does."""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from modelpool.backends.ctranslate2.convert import is_ct2_folder
from modelpool.config.sources import HubLocation
from tests.conftest import TTS_MODEL, sdk, serving
from tests.speech_metrics import words
from tests.whisper_hf import SAMPLE_RATE, build_hf_whisper_from_ct2, build_tiny_hf_whisper

pytest.importorskip("faster_whisper", reason="pip install 'modelpool[speech]'")
pytest.importorskip("transformers", reason="pip install 'modelpool[transformers]'")
MODEL = "tiny-hf-whisper"
REAL = "whisper-tiny.en-hf"
BROKEN = "half-copied-hf-whisper"
SENTENCE = "The weather will be sunny tomorrow morning."


def chirp_pcm(seconds: float = 2.0) -> np.ndarray:
    """A rising tone with a little seeded noise, as 16-bit samples."""
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    noise = np.random.default_rng(0).standard_normal(t.size)
    return (np.clip(0.3 * np.sin(2 * np.pi * 220 * t * (1 + t)) + 0.05 * noise, -1, 1) * 32767).astype(np.int16)


def wav_of(pcm: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(SAMPLE_RATE)
        writer.writeframes(pcm.tobytes())
    return buffer.getvalue()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_whisper(tmp_path_factory.mktemp("hf") / "tiny-whisper")


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def real_folder() -> Path:
    """Built once per machine (~20 s) into the work dir, as tests/vlm_models.py's models are."""
    return build_hf_whisper_from_ct2(HubLocation.work_dir / "test-models" / "whisper-tiny.en-hf-1")


@pytest.fixture(scope="module")
def broken_folder(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its weights cut to a third, as a copy that stopped half-way."""
    folder = tmp_path_factory.mktemp("broken") / "half-copied"
    folder.mkdir()
    for path in hf_folder.iterdir():
        data = path.read_bytes()
        (folder / path.name).write_bytes(data[: len(data) // 3] if path.suffix == ".safetensors" else data)
    return folder


@pytest.fixture(scope="module")
async def served(
    hf_folder: Path, real_folder: Path, broken_folder: Path, work_dir: Path
) -> AsyncIterator[tuple[Any, Any]]:
    models = {MODEL: {"source": str(hf_folder), "options": {"device": "cpu", "compute_type": "float32"}},
              REAL: {"source": str(real_folder)}, BROKEN: {"source": str(broken_folder)}}  # fmt: skip
    cli = {"enabled_models": [MODEL, REAL, BROKEN, TTS_MODEL], "models": models, "work_dir": str(work_dir)}
    async with serving(cli) as (app, http):
        yield app, http


def transformers_segments(folder: Path, pcm: np.ndarray) -> tuple[list[int], list[tuple[float, float]]]:
    """transformers' greedy `generate` with timestamps on faster-whisper's features of the
    audio (its mel pads in log-mel space, not the audio, so the two extractors differ)."""
    import torch
    from faster_whisper.feature_extractor import FeatureExtractor
    from transformers import WhisperForConditionalGeneration

    features = FeatureExtractor(feature_size=80)(pcm.astype(np.float32) / 32768)
    features = np.pad(features, ((0, 0), (0, 3000 - features.shape[1])))
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(features)[None], return_timestamps=True, return_dict_in_generate=True)
    spans = [(round(float(s["start"]), 2), round(float(s["end"]), 2)) for s in out["segments"][0]]
    return out["sequences"][0].tolist(), spans


async def test_converted_once_served_and_equal_to_transformers(
    served: tuple[Any, Any], hf_folder: Path, work_dir: Path
) -> None:
    app, http = served
    pcm = chirp_pcm()
    oai = sdk(http)
    reply = await oai.audio.transcriptions.create(
        model=MODEL, file=("chirp.wav", wav_of(pcm)), response_format="verbose_json", temperature=0
    )
    segments = [s.model_dump() for s in reply.segments or []]
    assert segments, "a random Whisper still decodes tokens"
    tokens = [t for s in segments for t in s["tokens"]]
    expected, spans = transformers_segments(hf_folder, pcm)
    assert tokens == expected[: len(tokens)] and len(tokens) < len(expected)
    assert [(round(s["start"], 2), round(s["end"], 2)) for s in segments] == spans[: len(segments)]
    models = (await oai.models.list()).data
    assert any(m.id == MODEL for m in models)

    converted = [p for p in (work_dir / "ct2").iterdir() if is_ct2_folder(p) and p.name.startswith("tiny-whisper")]
    assert len(converted) == 1 and "-float32-ct2-" in converted[0].name
    made = (converted[0] / "model.bin").stat().st_mtime_ns
    pool = app.state.pool
    await pool.unload(MODEL)
    again = await oai.audio.transcriptions.create(
        model=MODEL, file=("chirp.wav", wav_of(pcm)), response_format="verbose_json", temperature=0
    )
    assert [t for s in again.segments or [] for t in s.tokens] == tokens
    assert [p for p in (work_dir / "ct2").iterdir() if is_ct2_folder(p) and p.name.startswith("tiny-whisper")] == (
        converted
    )
    assert (converted[0] / "model.bin").stat().st_mtime_ns == made  # the second load converted nothing


async def test_real_weights_in_hugging_face_format_hear_speech_word_for_word(
    served: tuple[Any, Any], real_folder: Path, work_dir: Path
) -> None:
    _, http = served
    oai = sdk(http)
    speech = await oai.audio.speech.create(
        model=TTS_MODEL, voice="alloy", input=SENTENCE, response_format="wav", extra_body={"deterministic": True}
    )
    heard = await oai.audio.transcriptions.create(model=REAL, file=("speech.wav", speech.content))
    assert words(heard.text) == words(SENTENCE), heard.text
    made = (work_dir / "ct2").iterdir()
    converted = [p.name for p in made if p.name.startswith(real_folder.name) and is_ct2_folder(p)]
    assert len(converted) == 1 and "-int8-ct2-" in converted[0]  # the CPU's default compute type


async def test_a_half_copied_folder_is_a_clear_503(served: tuple[Any, Any]) -> None:
    _, http = served
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk(http).audio.transcriptions.create(model=BROKEN, file=("chirp.wav", wav_of(chirp_pcm(0.5))))
    assert caught.value.status_code == 503
    assert "cannot convert" in caught.value.message and "half-copied" in caught.value.message, caught.value.message
