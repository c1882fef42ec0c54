"""A `modelpool serve MODEL` child for `modelpool run` when no server answers: on a free
loopback port, and stopped (by its pid) when `run` ends. MODEL is anything `serve` takes
(a catalog id, a file or folder, an `hf:` reference); without a config file the child
serves that model alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from modelpool.cli.serve_sources import slug
from modelpool.hub.reference import looks_like_reference
from modelpool.services.ports import free_port

START_TIMEOUT_S = 300.0
STOP_GRACE_S = 30.0


class StartFailed(Exception):
    """The child exited or never answered; the message says why in one line."""


def serve_argv(model: str, port: int, config: Path | None) -> list[str]:
    """The child's command line: `serve MODEL` of this very interpreter."""
    argv = [sys.executable, "-m", "modelpool", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config is not None:
        argv += ["--config", str(config)]
    return [*argv, "--", model]


def served_id(model: str, served: Sequence[Mapping[str, Any]]) -> str:
    """The id the child serves MODEL under: MODEL itself when it is an id or alias there, the
    id `serve` makes of a path or reference (its slug), else the only model it serves."""
    for entry in served:
        if model == entry["id"] or model in entry.get("aliases", ()):
            return str(entry["id"])
    made = slug(model) if looks_like_reference(model) or Path(model).expanduser().exists() else None
    ids = [str(entry["id"]) for entry in served]
    if made in ids:
        return str(made)
    if len(ids) == 1:
        return ids[0]
    raise StartFailed(f"the server started for {model} serves {', '.join(ids) or 'nothing'}: name one of them")


@contextlib.contextmanager
def local_server(model: str, config: Path | None, timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """Start the child, wait until it answers /healthz, yield its URL; stop it afterwards
    (also on Ctrl-C and on errors). Its output goes to a temporary log, whose last line is
    the error when it fails to start."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        # A session of its own: the terminal's Ctrl-C, meant for `run`'s reply, must not
        # reach the server (run stops it, once, when it is done).
        process = subprocess.Popen(
            serve_argv(model, port, config), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(process, url, log, timeout_s, model)
            yield url
        finally:
            _stop(process)


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: IO[bytes], timeout_s: float, model: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartFailed(f"could not start a server for {model}: {_last_line(log).removeprefix('error: ')}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.1)  # the child is starting: poll until it answers or the deadline passes
    raise StartFailed(f"the server started for {model} did not answer within {timeout_s:.0f}s: {_last_line(log)}")


def _last_line(log: IO[bytes]) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
