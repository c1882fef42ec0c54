"""Stacks for tests: the CLI run as a subprocess against a private state directory, and
the two-service agent stack (an LLM modelpool and a speech modelpool) with per-service
config files discovered beside the stack file."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from modelpool.services.registry import Registry, ServiceRecord
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL

UP_TIMEOUT_S = 300


def cli(state_dir: Path, *args: str, timeout_s: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`modelpool ARGS --state-dir STATE_DIR`, to completion."""
    argv = [sys.executable, "-m", "modelpool", *args, "--state-dir", str(state_dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def write_agent_stack(directory: Path, *, name: str = "agent", port_base: int = 8100) -> Path:
    """llm (persistent) serves chat and embeddings; speech serves Whisper and Piper. Their
    configs are `llm.yaml` and `speech.yaml` beside the stack file, found by name."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "llm.yaml").write_text(yaml.safe_dump({"enabled_models": [CHAT_MODEL, EMBED_MODEL]}))
    (directory / "speech.yaml").write_text(yaml.safe_dump({"enabled_models": [STT_MODEL, TTS_MODEL]}))
    stack = {
        "name": name,
        "port_base": port_base,
        "services": {"llm": {"modelpool": {}, "persistent": True}, "speech": {"modelpool": {}}},
    }
    path = directory / "stack.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def by_name(state_dir: Path) -> dict[str, ServiceRecord]:
    return {r.name: r for r in Registry(state_dir).records()}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)
