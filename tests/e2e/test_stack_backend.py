"""The agent sample's launcher contract on `modelpool up / down` (real CLI subprocesses, cheap
`http.server`-style services): `model_backend: nim` read from the worker's YAML skips the
services the hosted overlay replaces; the stack's `.env` and the saved keys its backend lists
(no other saved key) reach every service without overriding the real environment and without
ever being printed; a backend's
missing key stops `up` before anything starts; `down --port` stops a registered service, a
real unregistered modelpool server, and refuses anything else."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from modelpool.services.pids import is_alive
from modelpool.services.ports import free_port
from modelpool.services.registry import Registry
from tests.conftest import EMBED_MODEL
from tests.processes import modelpool_serve, running
from tests.stacks import UP_TIMEOUT_S

KEY = "nvapi-saved-6c1d-never-print-me"
# A service that reports what its environment holds (the key only as a digest), then serves HTTP.
REPORTER = (
    "import hashlib, http.server, json, os, sys\n"
    "key = os.environ.get('NGC_API_KEY', '')\n"
    "report = {'key_sha256': hashlib.sha256(key.encode()).hexdigest() if key else None,\n"
    "          'from_dotenv': os.environ.get('FROM_DOTENV'), 'env_wins': os.environ.get('ENV_WINS'),\n"
    "          'unlisted': os.environ.get('UNLISTED_SAVED_KEY')}\n"
    "open(sys.argv[2], 'w').write(json.dumps(report))\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
)


WEB = [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"]


def run_cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "modelpool", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=UP_TIMEOUT_S, env=env, check=False)


@pytest.fixture
def cli_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The CLI's environment: a private registry and credentials file, no NGC_API_KEY of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("NGC_API_KEY", "FROM_DOTENV")}
    env.update(MODELPOOL_STATE_DIR=str(tmp_path / "state"), MODELPOOL_CREDENTIALS=str(tmp_path / "cfg" / "cred.json"),
               ENV_WINS="from the real environment")  # fmt: skip
    yield env
    run_cli(env, "down", "--all", "--grace", "5")


def sample_stack(folder: Path, backend: str) -> Path:
    """The sample's shape: a local vlm the NIM overlay replaces, and a worker that reads
    model_backend from its own YAML (the stack reads the same key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.yaml").write_text(f"model_backend: {backend}\n")
    (folder / "reporter.py").write_text(REPORTER)
    (folder / ".env").write_text("# the stack's .env\nFROM_DOTENV='dotenv value'\nexport ENV_WINS=from-dotenv\n")
    stack = {
        "port_base": free_port(),
        "model_backend_file": "worker.yaml",
        "credentials": {"nim": ["NGC_API_KEY"]},
        "services": {
            "vlm": {"command": WEB, "health_path": "/", "replaced_by": ["nim"]},
            "worker": {
                "command": [sys.executable, "reporter.py", "{port}", str(folder / "report.json")],
                "health_path": "/",
                "depends_on": ["vlm"],
            },
        },
    }
    path = folder / "stack.yaml"
    path.write_text(yaml.safe_dump(stack))
    return path


def test_nim_backend_skips_what_it_replaces_and_hands_on_saved_keys(tmp_path: Path, cli_env: dict[str, str]) -> None:
    stack = sample_stack(tmp_path / "sample", "nim")
    missing = run_cli(cli_env, "up", str(stack), "-d")
    assert missing.returncode == 2 and "model_backend nim needs NGC_API_KEY" in missing.stdout
    assert Registry(tmp_path / "state").records() == []  # nothing started without the key

    saved = run_cli(cli_env, "credentials", "set", "NGC_API_KEY", stdin=KEY + "\n")
    assert saved.returncode == 0, saved.stderr
    unlisted = run_cli(cli_env, "credentials", "set", "UNLISTED_SAVED_KEY", stdin="another service's key\n")
    assert unlisted.returncode == 0, unlisted.stderr  # saved, but the stack lists only NGC_API_KEY
    up = run_cli(cli_env, "up", str(stack), "-d")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "vlm: not started: model_backend nim replaces it" in up.stdout
    assert [r.name for r in Registry(tmp_path / "state").records()] == ["worker"]
    report = json.loads((tmp_path / "sample" / "report.json").read_text())
    assert report == {"key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "from_dotenv": "dotenv value",
                      "env_wins": "from the real environment", "unlisted": None}  # fmt: skip
    listed = run_cli(cli_env, "credentials", "list")
    logs = "".join(p.read_text() for p in (tmp_path / "state").rglob("*.log"))
    for text in (missing.stdout, missing.stderr, saved.stdout, up.stdout, up.stderr, listed.stdout, logs):
        assert KEY not in text
    assert listed.stdout.split() == ["NGC_API_KEY", "UNLISTED_SAVED_KEY"]

    local = run_cli(cli_env, "up", str(stack), "-d", "--model-backend", "local")  # the override: vlm starts too
    assert local.returncode == 0, local.stdout
    assert sorted(r.name for r in Registry(tmp_path / "state").records()) == ["vlm", "worker"]


def test_the_credentials_file_is_private_and_refused_when_it_is_not(tmp_path: Path, cli_env: dict[str, str]) -> None:
    assert run_cli(cli_env, "credentials", "set", "NGC_API_KEY", stdin=KEY).returncode == 0
    path = Path(cli_env["MODELPOOL_CREDENTIALS"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"NGC_API_KEY": KEY}
    for bad_name, value in (("1BAD", KEY), ("NGC API", KEY), ("EMPTY", ""), ("HUGE", KEY * 400)):
        refused = run_cli(cli_env, "credentials", "set", bad_name, stdin=value)
        assert refused.returncode == 2 and KEY not in refused.stdout + refused.stderr
    argv = [sys.executable, "-m", "modelpool", "credentials", "set", "BYTES"]
    for stdin in (b"\xff\xfe" + KEY.encode() + b"\n", None):  # not text; no stdin at all
        odd = subprocess.run(argv, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                             capture_output=True, timeout=UP_TIMEOUT_S, env=cli_env, check=False)  # fmt: skip
        assert odd.returncode == 2 and b"Traceback" not in odd.stderr and KEY.encode() not in odd.stdout + odd.stderr
    path.chmod(0o644)
    listed = run_cli(cli_env, "credentials", "list")
    assert listed.returncode == 2 and f"chmod 600 {path}" in listed.stdout + listed.stderr
    up = run_cli(cli_env, "up", str(sample_stack(tmp_path / "sample", "nim")), "-d")
    assert up.returncode == 2 and "can be read by other users" in up.stdout and KEY not in up.stdout
    path.chmod(0o600)
    assert run_cli(cli_env, "credentials", "remove", "NGC_API_KEY").stdout.strip() == "removed NGC_API_KEY"
    assert json.loads(path.read_text()) == {}


def test_down_by_port_stops_only_servers_it_may(tmp_path: Path, cli_env: dict[str, str]) -> None:
    nothing = run_cli(cli_env, "down", "--port", str(free_port()))
    assert nothing.returncode == 0 and "not running" in nothing.stdout

    web_port = free_port()
    argv = [sys.executable, "-m", "http.server", str(web_port), "--bind", "127.0.0.1"]
    with running(argv, tmp_path / "web.log", "/", port=web_port) as unrelated:
        refused = run_cli(cli_env, "down", f":{web_port}")
        assert refused.returncode == 1 and "is not a modelpool or engine server" in refused.stdout
        assert is_alive(unrelated.process.pid)

    with modelpool_serve(tmp_path / "pool.log", "--models", EMBED_MODEL) as pool:  # not in any registry
        port = pool.url.rsplit(":", 1)[1]
        stopped = run_cli(cli_env, "down", "--port", port, "--grace", "20")
        assert stopped.returncode == 0 and stopped.stdout.split() == ["port", port, "pid", str(pool.process.pid),
                                                                      "terminated"]  # fmt: skip
        assert pool.process.wait(timeout=10) is not None

    stack = sample_stack(tmp_path / "sample", "local")
    assert run_cli(cli_env, "up", str(stack), "-d", "-s", "vlm").returncode == 0
    (vlm,) = Registry(tmp_path / "state").records()
    by_registry = run_cli(cli_env, "down", "--port", str(vlm.port))  # registered: stopped as `down vlm` would
    assert by_registry.returncode == 0 and vlm.id in by_registry.stdout
    assert Registry(tmp_path / "state").records() == []
    bad = run_cli(cli_env, "down", ":http")
    assert bad.returncode == 2 and "is not :PORT" in bad.stdout
