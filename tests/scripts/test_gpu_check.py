"""scripts/gpu_check*: the GPU check keeps working on a machine without a GPU. The dry run
(and a run with no GPU) reports every check as skipped and exits 0; every check the issue
and the helpers' GPU notes ask for exists; the random GGUF the GPU machine writes loads in
llama.cpp; the llama.cpp checks' plumbing runs to a verdict on the CPU (GPU offload and
NVML readings stood in); what the prepare script downloads is pinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.nvml_standin import GiB, nvml_standin, one_gpu
from tests.repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
REQUIRED = {
    # issue 32 item 6
    "nvml_vs_nvidia_smi": "NVML numbers equal to nvidia-smi's",
    "nvml_per_process": "per-process VRAM equal to nvidia-smi --query-compute-apps",
    "llama_cpp_cuda": "a CUDA build of the llama.cpp engine, VRAM freed on unload, batch-invariance off on GPU",
    "llama_server_cuda": "an engine process on CUDA measured by PID",
    "transformers_cuda": "transformers on cuda, torch's cache released on unload",
    "transformers_device_map_auto": "device_map: auto",
    "vllm_in_process": "the in-process vLLM path (skipped with its reason where vLLM is missing)",
    # the helpers' notes (/tmp/brief32/gpu_notes.md): knobs
    "llama_cpp_kv_q8_flash_attention": "q8_0 K/V caches with flash attention on and auto, in process on CUDA",
    "llama_server_native_draft": "native llama-server with a draft model on the GPU (-ngld)",
    # spec
    "llama_cpp_speculative_cuda": "a draft model in process on CUDA: greedy equal, acceptance reported",
    "vllm_serve_fp8_kv_speculative": "vllm_serve with an fp8 KV cache and ngram speculation",
    # vram
    "transformers_unload_frees_vram": "used memory back within 50 MiB of before the load",
    # issue 32 item 5 (the GPU side of faster_whisper)
    "faster_whisper_cuda": "CTranslate2 on CUDA",
}
"""Every check asked for (the brief and /tmp/brief32/gpu_notes.md), with why."""
__all__ = ["nvml_standin"]  # the fixture, used by name


def script(name: str) -> ModuleType:
    return load_script(name, register=True)


def env_without_gpu(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}  # fmt: skip  # no nvidia-smi on it


def read_report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "gpu_check.json").read_text())
    assert (out / "gpu_check.md").read_text().startswith("# GPU check: 0 passed, 0 failed")
    return data


def test_every_required_check_exists() -> None:
    checks = script("gpu_check").CHECKS
    assert set(REQUIRED) <= set(checks), sorted(set(REQUIRED) - set(checks))
    assert all(check.what for check in checks.values())
    documented = (ROOT / "docs" / "gpu.md").read_text()
    assert [name for name in checks if f"| `{name}` |" not in documented] == []


@pytest.mark.parametrize("argv", [["scripts/gpu_check.sh", "--dry-run"], ["scripts/gpu_check.sh"]])
def test_without_a_gpu_every_check_is_skipped_and_the_exit_status_is_0(tmp_path: Path, argv: list[str]) -> None:
    done = subprocess.run(argv, cwd=ROOT, env=env_without_gpu(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = read_report(tmp_path / "out")
    assert set(report["checks"]) == set(script("gpu_check").CHECKS)
    assert {c["status"] for c in report["checks"].values()} == {"skip"}
    reason = "no GPU (dry run)" if "--dry-run" in argv else "no GPU (no nvidia-smi)"
    assert {c["detail"] for c in report["checks"].values()} == {reason}
    assert report["ok"] and report["counts"] == {"pass": 0, "fail": 0, "skip": len(report["checks"])}


def test_the_random_gguf_loads_and_answers_in_llama_cpp(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("transformers")
    writer = script("gpu_check_gguf")
    path = writer.write_llama_gguf(tmp_path / "tiny.gguf", writer.Shape(2, 64, 128, 4))
    assert writer.write_llama_gguf(path, writer.Shape(2, 64, 128, 4)) == path  # written once
    model = llama_cpp.Llama(str(path), n_ctx=128, verbose=False)
    tokens = model.tokenize(b"The GPU memory check says hello", add_bos=False)
    assert model.detokenize(tokens) == b"The GPU memory check says hello"
    reply = model.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert reply["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("name", ["llama_cpp_cuda", "llama_server_cuda"])
def test_the_llama_cpp_checks_reach_a_verdict_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """With GPU offload claimed and NVML and nvidia-smi reading nothing, the checks run their
    whole path (a load, greedy answers, the pool's memory rows, an unload) and fail only on
    the GPU numbers."""
    pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    writer, checks = script("gpu_check_gguf"), script("gpu_check")
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    tiny = writer.Shape(2, 64, 128, 4)
    monkeypatch.setattr(checks, "random_gguf", lambda work: writer.write_llama_gguf(work / "t.gguf", tiny))
    monkeypatch.setattr(checks, "my_gpu_bytes", lambda pids=None: 0)
    monkeypatch.setattr(checks, "smi", lambda *query: [])  # nvidia-smi lists no process
    result = checks.run_one(name, tmp_path)
    assert result.status == "fail" and "Error" not in result.detail, result
    assert result.numbers["reply"] and result.numbers["measured_gpu_mib"] == 0
    assert "MiB" in result.detail and "greedy" not in result.detail
    if name == "llama_cpp_cuda":
        assert result.numbers["batch_invariant"] is False  # n_gpu_layers -1: off, as documented


def test_the_kv_cache_check_runs_its_two_loads_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """q8_0 caches with flash attention on and auto: nothing in it is GPU-only but the build."""
    pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    writer, checks = script("gpu_check_gguf"), script("gpu_check")
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    tiny = writer.Shape(2, 64, 128, 2)  # heads of 32: a q8_0 V cache takes blocks of 32
    monkeypatch.setattr(checks, "random_gguf", lambda work: writer.write_llama_gguf(work / "t.gguf", tiny))
    result = checks.run_one("llama_cpp_kv_q8_flash_attention", tmp_path)
    assert result.status == "pass", result
    assert set(result.numbers["replies"]) == {"on", "auto"} and all(result.numbers["replies"].values())


def test_what_the_prepare_script_downloads_is_pinned_and_ignored() -> None:
    text = (SCRIPTS / "gpu_check_prepare.sh").read_text()
    listed = [*text.split("WHEELS=(", 1)[1].split(")", 1)[0].split(), "llama-cpp-python"]
    pins = {line.split("==")[0].lower() for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    assert [name for name in listed if name.lower() not in pins] == []
    ignored = subprocess.run(["git", "check-ignore", "-q", ".gpu/wheels/x.whl"], cwd=ROOT)
    assert ignored.returncode == 0


def test_the_speculative_check_runs_where_the_option_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where llama_cpp has `speculative`: two loads, the draft's guesses counted (the target as
    its own draft: all accepted), failing only on the GPU numbers; without it: skipped."""
    pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    from modelpool.backends.llama_cpp.backend import LlamaCppOptions

    writer, checks = script("gpu_check_gguf"), script("gpu_check")
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    tiny = writer.Shape(2, 64, 128, 2)
    monkeypatch.setattr(checks, "random_gguf", lambda work: writer.write_llama_gguf(work / "t.gguf", tiny))
    monkeypatch.setattr(checks, "my_gpu_bytes", lambda pids=None: 0)
    result = checks.run_one("llama_cpp_speculative_cuda", tmp_path)
    if "speculative" not in LlamaCppOptions.model_fields:
        assert result.status == "skip", result
        return
    assert result.status == "fail" and result.detail.startswith("with the draft the load took"), result
    assert result.numbers["drafted"] > 0 and result.numbers["acceptance"] == 1.0


@pytest.mark.parametrize(
    ("smi_change", "problem"),
    [({}, None), ({"used": 1024 + 100}, "used 1024 MiB by NVML"), ({"uuid": "GPU-other"}, "UUID GPU-standin-0")],
)
def test_the_nvml_check_compares_with_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml_standin: Any, smi_change: dict[str, Any], problem: str | None
) -> None:
    """modelpool's probe on the NVML stand-in against nvidia-smi's CSV fed the same numbers:
    equal passes; used memory off by 100 MiB, or another UUID, fails naming it."""
    nvml_standin(one_gpu(total=80 * GiB, used=GiB))
    checks = script("gpu_check")
    row = {"index": "0", "uuid": "GPU-standin-0", "total": str(80 * 1024), "used": "1024"}
    row.update({key: str(value) for key, value in smi_change.items()})
    monkeypatch.setattr(checks, "smi", lambda *query: [[row["index"], row["uuid"], row["total"], row["used"]]])
    result = checks.run_one("nvml_vs_nvidia_smi", tmp_path)
    assert result.numbers["cuda:0"]["nvml_total_mib"] == 80 * 1024
    if problem is None:
        assert result.status == "pass", result
    else:
        assert result.status == "fail" and problem in result.detail, result


@pytest.mark.skipif(os.environ.get("MODELPOOL_TEST_GPU_PREPARE") != "1", reason="downloads ~80 MB from PyPI: opt in")
def test_the_prepare_script_fills_gpu_under_the_carry_limit() -> None:
    done = subprocess.run(["scripts/gpu_check_prepare.sh"], cwd=ROOT, env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    mib = int(summary.split(": ")[-1].split(" MiB")[0])
    assert 0 < mib < 60, summary
    assert sorted(p.name for p in (ROOT / ".gpu").glob("llama_cpp_python-*-cuda-src.tar.gz"))
