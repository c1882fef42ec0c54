"""`modelpool pull` as a user runs it: a real subprocess, the real client, the stand-in hub."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import hub_repos as r
from tests.hub_standin import HubStandin

SRC = Path(__file__).resolve().parents[2] / "src"


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env, "PYTHONPATH": str(SRC), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "modelpool", "pull", *args], env=full, capture_output=True, text=True, timeout=timeout
    )


def _env(hub: HubStandin, cache: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache), "HF_TOKEN": "", **extra}


def test_pull_detects_the_backend_and_takes_the_quant(hub_standin: HubStandin, hub_env: Path) -> None:
    done = _run([f"{r.GGUF_REPO}:Q4_1"], _env(hub_standin, hub_env))
    assert done.returncode == 0, done.stderr
    assert "llama_cpp" in done.stderr and "100%" not in done.stdout  # bars go to stderr
    path = Path(done.stdout.strip().split(" → ")[-1])
    assert path.name == r.gguf_name("Q4_1") and path.is_file()
    assert "98.4" in done.stderr or "MB" in done.stderr  # the bar's byte counts


def test_pull_folder_with_a_forced_backend(hub_standin: HubStandin, hub_env: Path) -> None:
    done = _run([f"hf:{r.HF_REPO}", "--backend", "transformers", "-q"], _env(hub_standin, hub_env))
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip().split(" → ")[-1])
    assert sorted(p.name for p in folder.iterdir()) == sorted(r.HF_WANTED)


def test_gated_without_then_with_token_never_printed(hub_standin: HubStandin, hub_env: Path) -> None:
    args = [f"hf:{r.GATED_REPO}", "--backend", "transformers"]
    refused = _run(args, _env(hub_standin, hub_env))
    assert refused.returncode == 1 and "is gated: set HF_TOKEN" in refused.stderr
    done = _run(args, _env(hub_standin, hub_env, HF_TOKEN=hub_standin.token))
    assert done.returncode == 0, done.stderr
    assert hub_standin.token not in done.stdout + done.stderr + refused.stdout + refused.stderr


def test_bad_references_and_offline(hub_standin: HubStandin, hub_env: Path) -> None:
    bad = _run(["hf:not-a-repo"], _env(hub_standin, hub_env))
    assert bad.returncode == 2 and "bad model reference" in bad.stderr
    offline = _run([f"hf:{r.HF_REPO}", "--backend", "transformers"], _env(hub_standin, hub_env, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 1 and "HF_HUB_OFFLINE" in offline.stderr and "Traceback" not in offline.stderr
    too_many = _run(["a/b"] * 33, _env(hub_standin, hub_env))
    assert too_many.returncode == 2 and "at most 32" in too_many.stderr
