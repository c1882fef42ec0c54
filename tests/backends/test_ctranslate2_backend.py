"""The CTranslate2 backend's declarations, its refusals, and its source folders (no weights:
the conversion itself and generation run in tests/e2e/test_ctranslate2.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelpool.backends.ctranslate2 import convert
from modelpool.backends.ctranslate2.backend import check_sampling
from modelpool.backends.ctranslate2.convert import ct2_folder_for, read_facts
from modelpool.backends.registry import model_capabilities
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError, InvalidRequest, ModelLoadFailed
from modelpool.inference import SamplingParams


def ct2_model(**options: object) -> ModelConfig:
    return ModelConfig(id="ct2", backend="ctranslate2", source="/models/x", options=options)


def test_capabilities_say_what_ct2_can_and_cannot_do() -> None:
    declared = model_capabilities(ct2_model(max_batch_size=8, inter_threads=2, max_model_len=2048)).as_json()
    assert declared["tasks"] == ["chat", "completion", "scoring"]
    assert (declared["tools"], declared["structured_output"], declared["prompt_scoring"]) == (False, False, True)
    assert (declared["engine_concurrency"], declared["context_length"]) == (16, 2048)


def test_unknown_or_bad_options_fail_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match="compute_type"):
        model_capabilities(ct2_model(compute_type="int4"))
    with pytest.raises(ConfigError, match="beam_size"):
        model_capabilities(ct2_model(beam_size=4))


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        (SamplingParams(presence_penalty=0.5), "presence_penalty"),
        (SamplingParams(frequency_penalty=0.5), "frequency_penalty"),
        (SamplingParams(min_p=0.1), "min_p"),
        (SamplingParams(temperature=0.7, seed=3), "seed"),
    ],
)
def test_what_ct2_cannot_do_is_a_400_naming_the_field(sampling: SamplingParams, param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        check_sampling(sampling, "ct2", "reject")
    assert raised.value.param == param and raised.value.status_code == 400


def test_a_seed_is_fine_where_it_changes_nothing_or_the_config_says_to_ignore_it() -> None:
    check_sampling(SamplingParams(temperature=0, seed=3), "ct2", "reject")  # greedy: reproducible anyway
    check_sampling(SamplingParams(temperature=0.7, top_k=1, seed=3), "ct2", "reject")
    check_sampling(SamplingParams(temperature=0.7, seed=3), "ct2", "ignore")
    check_sampling(SamplingParams(temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1), "ct2", "reject")


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_ct2_folder_is_used_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "ct2-model"
    write_json(folder / "config.json", {"bos_token": "<s>"})
    (folder / "model.bin").write_bytes(b"weights")
    assert ct2_folder_for(folder, tmp_path / "work", "int8") == folder
    assert read_facts(folder) == convert.ModelFacts(None, ())  # made elsewhere: no facts kept
    assert not (tmp_path / "work").exists()


def test_something_that_is_no_model_is_a_clear_load_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadFailed, match="neither a CTranslate2 folder"):
        ct2_folder_for(tmp_path / "notes.txt", tmp_path / "work", "int8")


def test_a_hugging_face_folder_is_converted_once_per_source_and_quantization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = tmp_path / "hf-model"
    write_json(hf / "config.json", {"max_position_embeddings": 2048, "eos_token_id": 7})
    write_json(hf / "generation_config.json", {"eos_token_id": [7, 9]})
    converted: list[Path] = []

    def fake_convert(source: Path, target: Path, quantization: str) -> None:
        converted.append(target)
        write_json(target / "config.json", {})
        (target / "model.bin").write_bytes(b"")
        write_json(target / convert.FACTS_FILE, convert._facts_of(source))

    monkeypatch.setattr(convert, "_convert", fake_convert)
    work = tmp_path / "work"
    first = ct2_folder_for(hf, work, "int8")
    assert ct2_folder_for(hf, work, "int8") == first and converted == [first]  # the second load reuses it
    assert read_facts(first) == convert.ModelFacts(2048, (7, 9))
    other_quantization = ct2_folder_for(hf, work, "int8_float16")
    write_json(hf / "config.json", {"max_position_embeddings": 4096})  # the source changed
    changed_source = ct2_folder_for(hf, work, "int8")
    assert len({first, other_quantization, changed_source}) == 3 and len(converted) == 3
