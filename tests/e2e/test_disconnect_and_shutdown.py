"""Against a real `modelpool serve` process: a client that goes away frees the model at
once (stream or not), and SIGTERM lets running requests finish, then exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import CHAT_MODEL
from tests.e2e.test_server_process import free_port, wait_ready

LONG = {
    "model": CHAT_MODEL,
    "messages": [{"role": "user", "content": "Write a very long story."}],
    "max_tokens": 2000,  # within the starter's 2048-token context
    "temperature": 1.0,
    "seed": 1,
    # A seeded sample is the same only on the same CPU and llama.cpp build: elsewhere it may
    # reach end-of-sequence early. ignore_eos makes it as long as max_tokens on any machine.
    "ignore_eos": True,
}
SHORT = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "enabled_models": [CHAT_MODEL],
                "models": {CHAT_MODEL: {"max_concurrency": 1, "max_queue": 4, "sampling": {"max_tokens": 2000}}},
                # Ample: the stream must finish by itself, not by the grace running out, and
                # on a loaded CI machine its 120 tokens took 60 s (2.8 s alone).
                "server": {"shutdown_grace_s": 300},
            }
        )
    )
    port = free_port()
    log = (tmp_path / "server.log").open("wb")
    started = time.monotonic()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "modelpool",
            "serve",
            "--port",
            str(port),
            "--config",
            str(config),
            "--log-format",
            "json",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, started, tmp_path / "server.log")
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def in_flight(url: str) -> int:
    models = httpx.get(f"{url}/v1/admin/models").json()["data"]
    return next(m["in_flight"] for m in models if m["id"] == CHAT_MODEL)


def wait_until_free(url: str, limit_s: float = 5.0) -> float:
    started = time.monotonic()
    while in_flight(url) and time.monotonic() - started < limit_s:
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_stream_whose_client_leaves_stops_generating(server) -> None:
    _, url = server
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response,
    ):
        lines = response.iter_lines()
        assert [next(lines) for _ in range(8)]  # a few tokens arrived: it is generating
        assert in_flight(url) == 1
    freed_after = wait_until_free(url)  # the connection is closed now
    assert in_flight(url) == 0, "the model is still busy with a request nobody reads"
    assert freed_after < 5
    started = time.monotonic()
    assert httpx.post(f"{url}/v1/chat/completions", json=SHORT, timeout=30).status_code == 200
    assert time.monotonic() - started < 5


def test_a_generate_stream_whose_client_leaves_stops_generating(server) -> None:
    """HRM's `/generate_stream` (its body names no model: the only one serves it, with the
    model's 2000-token default cap) stops within a token of its client leaving."""
    _, url = server
    body = {"prompts": ["Tell me a long story."], "ignore_eos": True}
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("POST", "/generate_stream", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert [next(lines) for _ in range(8)]  # a few tokens arrived: it is generating
        assert in_flight(url) == 1
    assert wait_until_free(url) < 5 and in_flight(url) == 0, "the model is still busy with a stream nobody reads"


def test_a_non_streaming_request_whose_client_leaves_is_cancelled(server) -> None:
    _, url = server
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=LONG, timeout=1.0)
    assert wait_until_free(url) < 5 and in_flight(url) == 0
    started = time.monotonic()
    assert httpx.post(f"{url}/v1/chat/completions", json=SHORT, timeout=30).status_code == 200
    assert time.monotonic() - started < 5


def test_sigterm_lets_the_running_stream_finish_then_exits_zero(server) -> None:
    process, url = server
    body = {**LONG, "max_tokens": 120, "stream": True}
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        payload = json.dumps(body).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        received = sock.recv(4096)
        assert b"200 OK" in received
        process.send_signal(signal.SIGTERM)
        while b"data: [DONE]" not in received:
            part = sock.recv(65536)
            if not part:
                break
            received += part
    assert b"data: [DONE]" in received and b'"finish_reason":"length"' in received
    assert process.wait(timeout=60) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2)
