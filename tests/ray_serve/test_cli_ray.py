"""`modelpool serve --ray` as a user runs it: a local Ray instance of its own, the same API,
and everything gone after SIGTERM. Runs before the two-node cluster module starts its cluster
(file order), so the two never share the machine's fixed Ray ports."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import psutil
import pytest
import typer
import yaml

from modelpool.config.loader import load_config
from modelpool.services.ports import free_port
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

    monkeypatch.setattr(ray_cli.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(typer.Exit) as exit_:
        ray_cli.serve_on_ray(load_config(None, environ={}), None)
    assert exit_.value.exit_code == 2
    assert "pip install 'modelpool[ray]'" in capsys.readouterr().err
