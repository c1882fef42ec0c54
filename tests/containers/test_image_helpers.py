"""The image build's helper scripts (deploy/docker/), run on the host as the build and the
health check run them: what they accept, and that bad input is a clear refusal."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.containers.host import REPO

DOCKER = REPO / "deploy" / "docker"
PYPROJECT = REPO / "pyproject.toml"


def requirements(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER / "requirements.py"), str(PYPROJECT), *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_requirements_follow_the_extras_that_name_modelpool() -> None:
    done = requirements("speech")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "fastapi>=0.133" in lines  # the core dependencies come first
    assert any(line.startswith("av>=") for line in lines)  # speech takes modelpool[audio]
    assert not any(line.startswith("modelpool") for line in lines)


def test_the_ray_extra_alone_is_the_pin() -> None:
    done = requirements("ray", "--extras-only")
    assert done.stdout.split() == ["ray[serve]==2.60.0"]


@pytest.mark.parametrize("extras", ["audio,nope", "audio,--index-url=http://evil.example", "llama;rm -rf /"])
def test_an_unknown_extra_fails_the_build_naming_it(extras: str) -> None:
    done = requirements(extras)
    assert done.returncode != 0 and done.stdout == ""
    assert "no extra" in done.stderr and "Traceback" not in done.stderr


class Ready(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def readyz() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def health(port: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        env={"MODELPOOL_SERVER__PORT": port}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_health_check_passes_on_200_and_fails_on_503(readyz: ThreadingHTTPServer) -> None:
    port = str(readyz.server_address[1])
    assert health(port).returncode == 0
    Ready.status = 503
    try:
        done = health(port)
    finally:
        Ready.status = 200
    assert done.returncode == 1 and "not ready" in done.stderr


@pytest.mark.parametrize("port", ["not-a-port", "99999", "1@evil.example", ""])
def test_a_bad_port_is_unhealthy_not_a_traceback(port: str) -> None:
    done = health(port)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "not ready" in done.stderr
