"""Which files each backend takes from a repo listing."""

from __future__ import annotations

import pytest

from modelpool.errors import ModelSourceError
from modelpool.hub.reference import Selector
from modelpool.hub.select import files_for, quant_tags, split_parts

GGUF = [
    "README.md",
    ".gitattributes",
    "m-Q4_K_M.gguf",
    "m-Q8_0.gguf",
    "m-IQ2_XS.gguf",
    "m-BF16-00001-of-00002.gguf",
    "m-BF16-00002-of-00002.gguf",
]
HF = [
    "config.json", "generation_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "chat_template.jinja", "pytorch_model.bin", "onnx/model.onnx", "flax_model.msgpack",
    "tf_model.h5", "README.md", "1_Pooling/config.json", "modules.json", "vocab.txt", "openvino/openvino_model.xml",
]  # fmt: skip


def test_quant_tag_is_case_insensitive_and_whole() -> None:
    assert files_for("llama_cpp", GGUF, Selector(quant="q8_0")) == ["m-Q8_0.gguf"]
    assert files_for("llama_cpp", GGUF, Selector(quant="IQ2_XS")) == ["m-IQ2_XS.gguf"]
    with pytest.raises(ModelSourceError, match=r"no GGUF file with quant tag Q4_K.*BF16, IQ2_XS, Q4_K_M, Q8_0"):
        files_for("llama_cpp", GGUF, Selector(quant="Q4_K"))  # a prefix of Q4_K_M is not its tag


def test_split_model_takes_every_part() -> None:
    expected = ["m-BF16-00001-of-00002.gguf", "m-BF16-00002-of-00002.gguf"]
    assert files_for("llama_cpp", GGUF, Selector(quant="bf16")) == expected
    assert files_for("llama_cpp", GGUF, Selector(filename="m-BF16-00002-of-00002.gguf")) == expected
    with pytest.raises(ModelSourceError, match="misses part"):
        split_parts("m-00001-of-00003.gguf", ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf"])


def test_default_quant_and_single_file() -> None:
    assert files_for("llama_cpp", GGUF, Selector()) == ["m-Q4_K_M.gguf"]
    assert files_for("llama_cpp", ["only.gguf", "README.md"], Selector()) == ["only.gguf"]
    with pytest.raises(ModelSourceError, match=r"choose one of F16, Q5_1"):
        files_for("llama_cpp", ["a-Q5_1.gguf", "a-F16.gguf"], Selector())


def test_vision_gguf_brings_its_projector() -> None:
    listing = ["v-Q4_K_M.gguf", "v-Q8_0.gguf", "mmproj-v-f16.gguf", "mmproj-v-Q8_0.gguf"]
    assert files_for("llama_cpp", listing, Selector()) == ["mmproj-v-f16.gguf", "v-Q4_K_M.gguf"]
    assert files_for("llama_cpp", listing, Selector(quant="Q8_0")) == ["mmproj-v-Q8_0.gguf", "v-Q8_0.gguf"]


def test_hf_folder_skips_other_formats() -> None:
    chosen = files_for("transformers", HF, Selector())
    assert "pytorch_model.bin" not in chosen  # safetensors are there
    assert not [n for n in chosen if n.endswith((".onnx", ".msgpack", ".h5", ".md", ".xml"))]
    assert {"config.json", "tokenizer.model", "chat_template.jinja", "1_Pooling/config.json", "vocab.txt"} <= set(
        chosen
    )
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} <= set(chosen)


def test_pickles_only_when_no_safetensors() -> None:
    listing = ["config.json", "pytorch_model.bin", "tokenizer.json", "model.onnx"]
    assert files_for("sentence_transformers", listing, Selector()) == [
        "config.json",
        "pytorch_model.bin",
        "tokenizer.json",
    ]


def test_ctranslate2_and_voices() -> None:
    whisper = ["model.bin", "config.json", "tokenizer.json", "vocabulary.txt", "README.md"]
    assert files_for("faster_whisper", whisper, Selector()) == [
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]
    piper = ["en_US-joe-medium.onnx", "en_US-joe-medium.onnx.json", "README.md"]
    assert files_for("piper", piper, Selector()) == piper[:2]


def test_a_named_file_must_exist_and_a_tag_needs_gguf() -> None:
    with pytest.raises(ModelSourceError, match=r"no file 'nope\.gguf'"):
        files_for("llama_cpp", GGUF, Selector(filename="nope.gguf"))
    with pytest.raises(ModelSourceError, match="no GGUF file with quant tag Q4_K_M"):
        files_for("transformers", HF, Selector(quant="Q4_K_M"))
    assert files_for("transformers", GGUF, Selector(quant="Q8_0")) == ["m-Q8_0.gguf"]  # it converts GGUF
    with pytest.raises(ModelSourceError, match="no files backend"):
        files_for("transformers", ["README.md", "model.onnx"], Selector())


def test_quant_tags() -> None:
    assert quant_tags(GGUF) == ["BF16", "IQ2_XS", "Q4_K_M", "Q8_0"]


def test_no_backend_yet_takes_the_repo_as_it_is() -> None:
    assert files_for("", GGUF, Selector()) == sorted(n for n in GGUF if n not in ("README.md", ".gitattributes"))
    assert files_for("", GGUF, Selector(quant="Q8_0")) == ["m-Q8_0.gguf"]


def test_a_hugging_face_whisper_for_faster_whisper_takes_what_its_conversion_reads() -> None:
    """No model.bin: the repo is in Hugging Face format, converted to CT2 at load."""
    listing = ["config.json", "generation_config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
               "flax_model.msgpack", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
               "preprocessor_config.json", "normalizer.json", "added_tokens.json", "special_tokens_map.json",
               "README.md"]  # fmt: skip
    chosen = files_for("faster_whisper", listing, Selector())
    assert "model.safetensors" in chosen and "preprocessor_config.json" in chosen and "tokenizer.json" in chosen
    assert not {"pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "README.md"} & set(chosen)
