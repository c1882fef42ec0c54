"""`modelpool ready`: its bounds and bad input are usage errors (exit 2) or one clear line
(exit 1), never a traceback or a wait without end; the URL it derives from a config; and
against the live `served` subprocess, a model that serves and one that does not exist.
(Waiting through a load, a timeout and a load error: tests/deploy/test_systemd.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from modelpool.cli.ready import url_of
from modelpool.config.schema import ServerConfig
from tests.cli.conftest import cli_environment
from tests.conftest import CHAT_MODEL
from tests.processes import Server

MODELPOOL = [sys.executable, "-m", "modelpool"]


def ready(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELPOOL, "ready", *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("wait", ["-1", "86401", "nan", "inf", "-inf", "soon"])
def test_a_wait_out_of_bounds_is_a_usage_error(wait: str) -> None:
    result = ready("--url", "http://127.0.0.1:9", "--wait", wait)
    assert result.returncode == 2 and "--wait" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1:8000", "file:///etc/passwd", "127.0.0.1:8000", "http://", "http://[::1"]
)
def test_a_url_that_is_not_http_is_a_usage_error(url: str) -> None:
    result = ready("--url", url)
    assert result.returncode == 2 and "--url" in result.stderr and "Traceback" not in result.stderr


def test_nothing_listening_is_one_line_and_exit_1_after_the_wait() -> None:
    started = time.monotonic()
    result = ready("--url", "http://127.0.0.1:9", "--wait", "1")
    assert result.returncode == 1 and time.monotonic() - started >= 1
    assert result.stderr.startswith("error: http://127.0.0.1:9 not ready after 1s; last: cannot reach")
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_config_with_port_0_asks_for_the_url(tmp_path: Path) -> None:
    config = tmp_path / "modelpool.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": 0}}))
    result = ready("--config", str(config))
    assert result.returncode == 2 and result.stderr.startswith("error: server.port is 0")


def test_a_broken_config_is_the_loader_s_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "modelpool.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": "--inject --flags"}}))
    result = ready("--config", str(config))
    assert result.returncode == 2 and result.stderr.startswith("error:") and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8123"),
        ("0.0.0.0", "http://127.0.0.1:8123"),  # all interfaces: reached on loopback
        ("::", "http://[::1]:8123"),
        ("::1", "http://[::1]:8123"),
        ("10.1.2.3", "http://10.1.2.3:8123"),
        ("models.internal", "http://models.internal:8123"),
    ],
)
def test_the_url_of_the_server_a_config_binds(host: str, url: str) -> None:
    assert url_of(ServerConfig(host=host, port=8123)) == url


def test_a_served_model_is_ready_and_an_unknown_one_fails_at_once(served: Server) -> None:
    env = cli_environment(served)  # MODELPOOL_URL and the key
    shown = ready("--model", CHAT_MODEL, env=env)
    assert shown.returncode == 0 and shown.stdout.strip() == f"ready: {served.url} ({CHAT_MODEL})", shown.stderr
    assert ready(env=env).returncode == 0
    started = time.monotonic()
    unknown = ready("--model", "no-such-model&model=x", "--wait", "30", env=env)
    assert unknown.returncode == 1 and time.monotonic() - started < 20  # not retried until --wait runs out
    assert unknown.stderr.startswith("error:") and "no-such-model&model=x" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
