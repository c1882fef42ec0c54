"""A Hugging Face Whisper converted to CTranslate2 by the shared CT2 conversion cache, for
real (the tiny random model of tests/whisper_hf.py): once per source and compute type, a
changed weight file converts again, loads at once convert once, a broken folder is a clear
load error."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from modelpool.backends.ctranslate2 import convert
from modelpool.backends.ctranslate2.convert import ct2_folder_for, is_ct2_folder
from modelpool.backends.faster_whisper import FasterWhisperOptions, ct2_whisper_folder, whisper_compute_type
from modelpool.errors import ModelLoadFailed
from tests.whisper_hf import build_tiny_hf_whisper

pytest.importorskip("ctranslate2", reason="pip install 'modelpool[ctranslate2]'")
pytest.importorskip("transformers", reason="pip install 'modelpool[transformers]'")


@pytest.fixture(scope="module")
def hf_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_whisper(tmp_path_factory.mktemp("hf") / "tiny-whisper")


def counting(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The real conversion, counted."""
    done: list[Path] = []
    real: Callable[[Path, Path, str], None] = convert._convert

    def counted(hf: Path, target: Path, quantization: str) -> None:
        done.append(target)
        real(hf, target, quantization)

    monkeypatch.setattr(convert, "_convert", counted)
    return done


def test_converted_once_with_what_faster_whisper_reads_and_again_when_a_weight_changes(
    hf_whisper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for path in hf_whisper.iterdir():  # a copy of its own: this test changes a weight file
        os.link(path, source / path.name) if path.suffix != ".safetensors" else (source / path.name).write_bytes(
            path.read_bytes()
        )
    converted = counting(monkeypatch)
    work = tmp_path / "work"
    first = ct2_folder_for(source, work, "float32")
    assert ct2_folder_for(source, work, "float32") == first and converted == [first]
    assert is_ct2_folder(first) and first.parent == work / "ct2" and "-float32-ct2-" in first.name
    for name in ("tokenizer.json", "preprocessor_config.json", "vocabulary.json"):
        assert (first / name).is_file(), name  # faster-whisper reads its tokenizer and mel size here
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # the same bytes, written again: a new mtime
    again = ct2_folder_for(source, work, "float32")
    assert again != first and converted == [first, again]


def test_the_compute_type_is_ctranslate2s_own_word_never_a_path(hf_whisper: Path, tmp_path: Path) -> None:
    # It names the converted folder: `x/../../../escaped` made a lock file outside the work dir.
    with pytest.raises(ValidationError, match="compute_type"):
        FasterWhisperOptions.model_validate({"compute_type": "x/../../../escaped"})
    work = tmp_path / "a" / "b" / "work"
    for word in ("x/../../../escaped", "auto"):
        with pytest.raises(ModelLoadFailed, match="not a quantization CTranslate2 converts to"):
            ct2_folder_for(hf_whisper, work, word)
    assert list(tmp_path.rglob("*")) == []
    # auto (the option's own word) is made concrete per device before it reaches the converter.
    assert whisper_compute_type("auto", "cpu") == "int8" and whisper_compute_type(None, "cuda") == "float16"
    assert whisper_compute_type("int8_float16", "cuda") == "int8_float16"


def test_loads_at_once_convert_once(hf_whisper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converted = counting(monkeypatch)
    work = tmp_path / "work"
    results: list[Path] = []
    start = threading.Barrier(3)

    def load() -> None:
        start.wait()
        results.append(ct2_folder_for(hf_whisper, work, "int8"))

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1 and len(converted) == 1
    leftovers = [p.name for p in (work / "ct2").iterdir() if ".partial-" in p.name]
    assert leftovers == []


@pytest.mark.parametrize("broken", ["no weights", "truncated weights", "no tokenizer"])
def test_a_broken_folder_is_a_clear_load_error(hf_whisper: Path, tmp_path: Path, broken: str) -> None:
    source = tmp_path / "broken"
    source.mkdir()
    for path in hf_whisper.iterdir():
        if broken == "no weights" and path.suffix == ".safetensors":
            continue
        if broken == "no tokenizer" and path.name.startswith("tokenizer"):
            continue
        data = path.read_bytes()
        (source / path.name).write_bytes(data[: len(data) // 3] if path.suffix == ".safetensors" and broken.startswith(
            "truncated") else data)  # fmt: skip
    reason = "has no tokenizer.json" if broken == "no tokenizer" else r"cannot convert .*broken for CTranslate2"
    with pytest.raises(ModelLoadFailed, match=reason):
        ct2_whisper_folder(source, tmp_path / "work", "int8")
    converted = tmp_path / "work" / "ct2"
    assert not converted.exists() or not any(is_ct2_folder(p) for p in converted.iterdir())
