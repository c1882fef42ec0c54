"""A real `modelpool serve` subprocess on a free loopback port, as `make serve` runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from modelpool.services.ports import free_port
from tests.conftest import CHAT_MODEL, EMBED_MODEL, STARTER_IDS, STT_MODEL, TTS_MODEL
from tests.processes import Server

START_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    with log_path.open("wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelpool",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-format",
                "json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MODELPOOL_SERVER__MODEL_WAIT_S": "60"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        ready_after = wait_ready(process, url, started, log_path)
        print(f"\nmodelpool serve: start-to-ready {ready_after:.1f}s")
        yield Server(process, url, log_path, ready_after)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_ready(process: subprocess.Popen[bytes], url: str, started: float, log_path: Path) -> float:
    saw_not_ready = False
    while time.monotonic() - started < START_TIMEOUT_S:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            response = httpx.get(f"{url}/readyz", timeout=2)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code == 200:
            assert response.json()["status"] == "ready"
            return time.monotonic() - started
        assert response.status_code == 503 and response.json()["status"] == "not_ready"
        saw_not_ready = True
        time.sleep(0.2)
    pytest.fail(f"not ready after {START_TIMEOUT_S}s (saw 503 first: {saw_not_ready})")


def test_openai_sdk_against_the_subprocess(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert {m.id for m in client.models.list().data} == STARTER_IDS
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        extra_headers={"X-Request-ID": "subprocess-req-1"},
        extra_body={"min_tokens": 1},  # sampled: an end-of-sequence first would leave no text
    )
    assert reply.choices[0].message.content
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        stream=True,
        extra_body={"min_tokens": 1},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    vectors = client.embeddings.create(model=EMBED_MODEL, input=["one", "two"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384


def test_json_log_lines_carry_the_request_id(server: Server) -> None:
    response = httpx.get(f"{server.url}/healthz", headers={"X-Request-ID": "subprocess-req-2"})
    assert response.headers["x-request-id"] == "subprocess-req-2"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        access = [e for e in server.log_lines() if e.get("logger") == "modelpool.access"]
        mine = [e for e in access if e.get("request_id") == "subprocess-req-2"]
        if mine:
            break
        time.sleep(0.1)
    assert mine and mine[0]["status"] == 200 and mine[0]["path"] == "/healthz"
    assert {"ts", "level", "message"} <= set(mine[0])


def test_cli_ps_load_unload_against_the_server(server: Server) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modelpool", *args, "--url", server.url],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )

    unloaded = cli("unload", EMBED_MODEL)
    assert unloaded.returncode == 0 and f"{EMBED_MODEL} unloaded" in unloaded.stdout
    table = cli("ps")
    assert table.returncode == 0
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if line.startswith("│")}
    assert "unloaded" in rows[EMBED_MODEL] and "ready" in rows[CHAT_MODEL]
    loaded = cli("load", EMBED_MODEL, "--set", "batch_size=8")
    assert loaded.returncode == 0 and f"{EMBED_MODEL} ready" in loaded.stdout
    wrong = cli("load", "no-such-model")
    assert wrong.returncode == 1 and "does not exist" in wrong.stdout


def test_speech_streams_a_sentence_at_a_time(server: Server) -> None:
    text = " ".join(f"This is sentence number {n} of the streaming test." for n in range(1, 9))
    body = {"model": TTS_MODEL, "input": text, "response_format": "pcm", "deterministic": True}
    started = time.monotonic()
    arrivals = []
    with httpx.stream("POST", f"{server.url}/v1/audio/speech", json=body, timeout=60) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            arrivals.append((time.monotonic() - started, len(chunk)))
    total = arrivals[-1][0]
    assert len(arrivals) >= 4
    assert arrivals[0][0] < total / 2  # the first audio came long before the last


def test_a_client_leaving_a_transcription_stops_the_decode(server: Server) -> None:
    text = " ".join(f"Sentence number {n} is part of a long recording." for n in range(1, 40))
    body = {"model": TTS_MODEL, "input": text, "response_format": "wav", "deterministic": True}
    wav = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=120).content  # ~2 minutes of speech
    files = {"file": ("long.wav", wav)}
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream(
            "POST", "/v1/audio/transcriptions", data={"model": STT_MODEL, "stream": "true"}, files=files
        ) as response,
    ):
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert "transcript.text.delta" in first
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = httpx.get(f"{server.url}/v1/admin/models").json()["data"]
        if next(m["in_flight"] for m in models if m["id"] == STT_MODEL) == 0:
            break
        time.sleep(0.05)
    models = httpx.get(f"{server.url}/v1/admin/models").json()["data"]
    assert next(m["in_flight"] for m in models if m["id"] == STT_MODEL) == 0
    served = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        data={"model": STT_MODEL},
        files={"file": ("short.wav", wav[: 44 + 2 * 22050 * 3])},
        timeout=30,
    )
    assert served.status_code == 200


def test_sigterm_stops_the_server_cleanly(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    messages = [e["message"] for e in server.log_lines()]
    assert "Application shutdown complete." in messages
    assert "models unloaded" in messages
