"""Joining a Ray cluster (`--address`, `--ray-address`, `ray.address`), or a refusal in one
line that says why. Ray's own failures say little and take long: a cluster with token
auth gives a bare "Failed to connect to Ray cluster" after 20 s of core log lines on
stderr (the cause is only in those) and then a long traceback; an address where nothing
listens keeps Ray retrying for minutes. No Ray import here: `deploy.connect` hands over
what Ray raised and logged."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from modelpool.errors import ConfigError

PROBE_TIMEOUT_S = 5.0
"""How long the port of the address given may take to accept a connection."""
_TOKEN_HINT = (
    "the cluster requires token authentication and this process sent no token or the wrong one: "
    "set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
)


@dataclass
class Captured:
    """What the process wrote to its stderr (file descriptor 2) while captured."""

    text: str = ""


def probe(address: str) -> None:
    """Refuse at once an address whose port takes no connection (Ray itself retries for
    minutes). `auto` and `local` name no port: Ray finds those itself."""
    endpoint = _endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise ConfigError(
        f"cannot join the Ray cluster at {address}: nothing accepted a connection at {host}:{port} ({reason}); "
        "check the host, the port (the head's GCS port, 6379 by default; ray://HOST:10001 for Ray Client) "
        "and that the cluster is up"
    )


def _endpoint(address: str) -> tuple[str, int] | None:
    target = address.removeprefix("ray://")
    if "://" in target or ":" not in target:
        return None
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def join_failure(address: str, error: BaseException, logged: str) -> str:
    """One line for the operator: what Ray raised joining `address`, read together with what
    its core logged meanwhile (`logged`), as the likely cause and what to do about it."""
    said = _one_line(str(error))
    seen = f"{type(error).__name__} {said} {logged}".lower()
    prefix = f"cannot join the Ray cluster at {address}"
    if "authenticationerror" in seen or "unauthenticated" in seen or "invalidauthtoken" in seen:
        return f"{prefix}: {_TOKEN_HINT}"
    if "version mismatch" in seen or "versions differ" in seen:
        return f"{prefix}: this process runs another Ray or Python version than the cluster ({_short(said)})"
    if "could not find any running ray instance" in seen:
        return (
            f"{prefix}: no running Ray cluster was found there: start one (`ray start --head`) "
            "or give its address (HOST:6379)"
        )
    if "timed out" in seen or "failed to connect" in seen:
        return f"{prefix}: it did not answer as a Ray cluster ({_short(said)}); check the address and that it is up"
    return f"{prefix}: {type(error).__name__}: {_short(said)}"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextlib.contextmanager
def stderr_captured() -> Iterator[Captured]:
    """File descriptor 2 goes to a temporary file for the duration: Ray's core logs there,
    past Python's `sys.stderr`, a line or more a second while a join fails. The text is in
    the `Captured` once the block ends."""
    captured = Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", "replace")
