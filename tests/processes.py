"""Real server subprocesses for tests: `modelpool serve` and llama-cpp-python's own
`python -m llama_cpp.server`, on free loopback ports, always stopped afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from modelpool.services.ports import free_port

START_TIMEOUT_S = 180


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready_after_s: float

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]


@contextmanager
def running(
    argv: Sequence[str], log_path: Path, ready_path: str, *, env: Mapping[str, str] | None = None, port: int
) -> Iterator[Server]:
    """Start `argv`, wait until `ready_path` answers 200, and stop it (SIGTERM, then SIGKILL) afterwards."""
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    try:
        yield Server(process, url, log_path, _wait_ready(process, url + ready_path, started, log_path))
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes], grace_s: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def modelpool_serve(
    log_path: Path, *args: str, env: Mapping[str, str] | None = None, port: int | None = None
) -> contextlib.AbstractContextManager[Server]:
    port = port or free_port()
    argv = [sys.executable, "-m", "modelpool", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    # Its own usage file beside its log (usage_store is on by default): budgets and totals of
    # one test's server never carry into another's. A test that sets the path keeps its own.
    own_usage = {USAGE_PATH_ENV: str(log_path.with_name(log_path.name + ".usage.sqlite"))}
    return running(argv, log_path, "/readyz", env={**own_usage, **(env or {})}, port=port)


USAGE_PATH_ENV = "MODELPOOL_USAGE_STORE__PATH"
"""`usage_store.path` from the environment (the config's environment layer)."""


def llama_cpp_server(
    log_path: Path, model: Path, alias: str, *, port: int | None = None
) -> contextlib.AbstractContextManager[Server]:
    port = port or free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--model_alias", alias, "--n_ctx", "2048", "--verbose", "false"]
    argv += ["--interrupt_requests", "false"]  # its default lets a new request cut off the running one
    return running(argv, log_path, "/v1/models", port=port)


def _wait_ready(process: subprocess.Popen[bytes], url: str, started: float, log_path: Path) -> float:
    while time.monotonic() - started < START_TIMEOUT_S:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):  # not listening yet
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.2)
    pytest.fail(f"{url} not ready after {START_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")
