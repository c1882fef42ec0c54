"""`modelpool status` against a live server (the `served` subprocess), `status --stacks`,
`ps` beside it; `--version` and shell completion from a real `python -m modelpool`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

import modelpool
from modelpool.cli.admin import models_table, state_text
from modelpool.cli.main import app
from tests.cli.conftest import cli_environment
from tests.conftest import CHAT_MODEL
from tests.processes import Server

MODELPOOL = [sys.executable, "-m", "modelpool"]


def invoke(server: Server, *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=cli_environment(server))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_status_names_the_server_its_version_memory_and_models(served: Server) -> None:
    shown = invoke(served, "status")
    lines = shown.splitlines()
    assert lines[0].split() == ["server", served.url, "(modelpool", f"{modelpool.__version__})"]
    assert lines[1].startswith("memory") and "process " in lines[1] and "budget" in lines[1]
    assert lines[2].startswith("models") and "running" in lines[2] and "queued" in lines[2]
    row = next(line for line in lines if CHAT_MODEL in line)
    assert any(state in row for state in ("ready", "unloaded", "loading"))


def test_status_json_and_ps_agree_with_it(served: Server) -> None:
    data = json.loads(invoke(served, "status", "--json"))
    assert data["url"] == served.url and data["version"] == modelpool.__version__
    assert [m["id"] for m in data["models"]] == [CHAT_MODEL]
    assert {"system", "budget", "models"} <= set(data["memory"])
    table = invoke(served, "ps")
    assert CHAT_MODEL in table and "STATE" in table
    assert "server " not in table  # ps is the models table alone; status adds the server


def test_status_without_a_key_is_one_clear_line(served: Server) -> None:
    env = {**cli_environment(served), "MODELPOOL_API_KEY": ""}
    result = CliRunner().invoke(app, ["status"], env=env)
    assert result.exit_code == 1
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1


def test_status_of_nothing_running_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "error:" in result.output and "Traceback" not in result.output


def test_status_stacks_lists_the_services(tmp_path: Path) -> None:
    shown = CliRunner().invoke(app, ["status", "--stacks", "--state-dir", str(tmp_path)])
    assert shown.exit_code == 0 and "no services are running" in shown.output
    as_json = CliRunner().invoke(app, ["status", "--stacks", "--json", "--state-dir", str(tmp_path)])
    assert as_json.exit_code == 0 and json.loads(as_json.output) == []


def test_version_is_the_package_and_python() -> None:
    expected = f"modelpool {importlib.metadata.version('modelpool')} (Python {platform.python_version()})"
    for flag in ("--version", "-V"):
        result = subprocess.run([*MODELPOOL, flag], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stdout.strip() == expected, result.stderr


def test_show_completion_prints_a_script_for_the_program() -> None:
    # typer's switch for naming the shell instead of detecting the parent's
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    bash = subprocess.run(
        [*MODELPOOL, "--show-completion", "bash"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bash.returncode == 0, bash.stderr
    assert "_modelpool_completion()" in bash.stdout
    assert "_MODELPOOL_COMPLETE=complete_bash" in bash.stdout
    assert "complete -o default -F _modelpool_completion modelpool" in bash.stdout
    zsh = completion_script("zsh")
    assert zsh.returncode == 0 and "#compdef modelpool" in zsh.stdout


def completion_script(shell: str) -> subprocess.CompletedProcess[str]:
    # typer's switch for naming the shell instead of detecting the parent process's
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    argv = [*MODELPOOL, "--show-completion", shell]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_a_download_shows_how_far_it_is() -> None:
    download = {"done_bytes": 50 * 2**20, "total_bytes": 200 * 2**20, "percent": 25.0, "file": "m.gguf"}
    model = {"id": "m", "state": "downloading", "replicas": [], "replicas_wanted": 1, "in_flight": 0, "queued": 0,
             "memory": {"counted_bytes": 0}, "expires_in_s": None, "last_error": None,
             "download": download}  # fmt: skip
    assert state_text(model) == "downloading 25% of 200 MiB"
    assert state_text({**model, "state": "ready", "download": None}) == "ready"
    console = Console(width=200, record=True)
    console.print(models_table([model]))
    assert "downloading 25% of 200 MiB" in console.export_text()
