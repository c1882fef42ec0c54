"""A stand-in container registry on loopback: just enough of the registry HTTP API (v2) for
a REAL `podman login` (or `docker login`), which is all the engine-container tests need of a
registry (no registry is reachable from this machine, and the engine image is local).

`podman login HOST:PORT` asks `GET /v2/`: without credentials it gets 401 with
`WWW-Authenticate: Basic realm="..."`, and asks again with `Authorization: Basic ...`; the
stand-in answers 200 when they match its one user, 401 otherwise. Every `/v2/` request is
recorded (`attempts`), so a test can say whether a login was tried and with what.

Podman talks plain HTTP only to a registry marked insecure: `registries_conf(path, ...)` writes
the file for `CONTAINERS_REGISTRIES_CONF`. Podman tries TLS first and then HTTP; the TLS
hello reaches this HTTP server as garbage and is answered 400 by `http.server` (not
recorded: it never parses as a request line).
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REALM = "modelpool-test-registry"


@dataclass(frozen=True)
class Attempt:
    """One `/v2/` request: the Basic credentials it carried (None: none, or not Basic)."""

    username: str | None
    password: str | None
    status: int


@dataclass
class RegistryStandin:
    username: str
    password: str
    host: str = "127.0.0.1"
    port: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    before_answering_credentials: Callable[[], None] | None = None
    """Called (in the handler's thread) before a request with credentials is answered: the
    `login` client is alive meanwhile, so a test can observe it without racing it."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def address(self) -> str:
        """What `podman login` and registries.conf name it by: `127.0.0.1:PORT`."""
        return f"{self.host}:{self.port}"

    def record(self, attempt: Attempt) -> None:
        with self._lock:
            self.attempts.append(attempt)

    def credentialed(self) -> list[Attempt]:
        """The attempts that carried credentials (a login's second request)."""
        with self._lock:
            return [a for a in self.attempts if a.username is not None]


def registries_conf(path: Path, *registries: RegistryStandin) -> Path:
    """A registries.conf (for CONTAINERS_REGISTRIES_CONF) that lets Podman speak plain HTTP
    to the stand-ins."""
    path.write_text("".join(f'[[registry]]\nlocation = "{r.address}"\ninsecure = true\n' for r in registries))
    return path


def _basic_credentials(header: str | None) -> tuple[str, str] | None:
    if header is None or not header.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(header.removeprefix("Basic ").strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    username, separator, password = decoded.partition(":")
    return (username, password) if separator else None


def _handler(registry: RegistryStandin) -> type[BaseHTTPRequestHandler]:
    class RegistryHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v2":
                self._answer(404, b'{"errors":[{"code":"UNSUPPORTED"}]}')
                return
            credentials = _basic_credentials(self.headers.get("Authorization"))
            if credentials is not None and registry.before_answering_credentials is not None:
                registry.before_answering_credentials()
            status = 200 if credentials == (registry.username, registry.password) else 401
            username, password = credentials if credentials is not None else (None, None)
            registry.record(Attempt(username, password, status))
            self._answer(status, b"{}" if status == 200 else b'{"errors":[{"code":"UNAUTHORIZED"}]}')

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            if status == 401:
                self.send_header("WWW-Authenticate", f'Basic realm="{REALM}"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the attempts are the record; stderr stays quiet

    return RegistryHandler


@contextmanager
def registry_standin(username: str, password: str) -> Iterator[RegistryStandin]:
    """A running stand-in on a free loopback port that accepts `username`/`password`."""
    registry = RegistryStandin(username, password)
    server = ThreadingHTTPServer((registry.host, 0), _handler(registry))
    server.daemon_threads = True
    registry.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="registry-standin", daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
