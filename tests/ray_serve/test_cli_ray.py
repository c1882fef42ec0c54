"""`modelpool serve --ray` as a user runs it: a local Ray instance of its own, the same API,
and everything gone after SIGTERM. Runs before the two-node cluster module starts its cluster
(file order), so the two never share the machine's fixed Ray ports."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
import typer
import yaml

from modelpool.config.loader import load_config
from modelpool.services.ports import free_port
from tests.polling import wait_until
from tests.processes import running

pytestmark = pytest.mark.ray


def ray_processes(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if p.name() in {"raylet", "gcs_server"}]


def test_serve_ray_deploys_on_a_local_ray_and_leaves_nothing_behind(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "modelpool.yaml"
    config.write_text(yaml.safe_dump({"enabled_models": ["all-minilm-l6-v2"], "server": {"ui": False}}))
    argv = [sys.executable, "-m", "modelpool", "serve", "--ray", "--config", str(config), "--port", str(port)]
    with running(argv, tmp_path / "serve.log", "/readyz", port=port) as server:
        started = ray_processes(server.process.pid)
        assert started, "no Ray instance was started"
        reply = httpx.post(server.url + "/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "hi"}, timeout=60)
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["data"][0]["embedding"]) == 384
        listed = httpx.get(server.url + "/v1/admin/models/all-minilm-l6-v2/status", timeout=10).json()
        assert [replica["node_id"] is not None for replica in listed["replicas"]] == [True]
    assert server.process.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], (
        "the local Ray instance outlived `modelpool serve --ray`"
    )
    log = (tmp_path / "serve.log").read_text()
    assert "deploying mp-all-minilm-l6-v2" in log


def test_ray_mode_without_ray_installed_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from modelpool.cli import ray as ray_cli

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # the module ray_cli looks it up in
    with pytest.raises(typer.Exit) as exit_:
        ray_cli.serve_on_ray(load_config(None, environ={}), None)
    assert exit_.value.exit_code == 2
    assert "pip install 'modelpool[ray]'" in capsys.readouterr().err


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def token_auth_head() -> Iterator[int]:
    """A Ray head with token auth (`ray start --head`, RAY_AUTH_MODE=token), on free ports,
    in a short temp dir (Ray's socket paths must stay under 108 bytes); yields its GCS port.
    Stopped by its process id (SIGTERM to `ray start --block`, which stops what it started)."""
    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    port = free_port()
    ports = ["--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port"]
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", str(port),
            "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--include-dashboard", "false",
            "--temp-dir", str(folder), *[part for flag in ports for part in (flag, str(free_port()))]]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    with (folder / "head.log").open("wb") as log:
        head = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: accepts(port) or head.poll() is not None, "the token-auth head's GCS port", 90)
        assert head.poll() is None, (folder / "head.log").read_text()[-2000:]
        yield port
    finally:
        started = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.send_signal(signal.SIGTERM)
        head.wait(timeout=60)
        _, alive = psutil.wait_procs(started, timeout=30)
        for process in alive:
            process.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_joining_a_cluster_with_token_auth_says_so_in_one_line(tmp_path: Path) -> None:
    """Without the cluster's token, Ray's join fails after ~20 s of core log lines with a bare
    "Failed to connect" and a long traceback: modelpool names the cause, in one line, exit 2."""
    config = tmp_path / "modelpool.yaml"
    config.write_text(yaml.safe_dump({"enabled_models": ["all-minilm-l6-v2"], "server": {"ui": False}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    with token_auth_head() as port:
        argv = [sys.executable, "-m", "modelpool", "ray", "deploy", "--address", f"127.0.0.1:{port}", "--config",
                str(config)]  # fmt: skip
        joined = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert joined.returncode == 2, joined.stderr[-3000:]
    assert joined.stderr.strip().splitlines() == [
        f"error: cannot join the Ray cluster at 127.0.0.1:{port}: the cluster requires token authentication and "
        "this process sent no token or the wrong one: set RAY_AUTH_MODE=token and the cluster's token "
        "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
    ]
