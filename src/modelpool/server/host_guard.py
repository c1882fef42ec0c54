"""Browsers cannot be turned against the server: the `Host` and `Origin` rule, applied once,
outermost, to every HTTP route, `/mcp` and the realtime WebSocket alike.

Two attacks it stops, both from a web page the server's user happens to open:

- DNS rebinding: the page's own name (`evil.example`) is made to resolve to 127.0.0.1, so
  the browser deems the server same-origin and lets the page read its answers. The request
  still carries `Host: evil.example`. On a loopback bind only loopback names (and
  `server.allowed_hosts`) are accepted: 421.
- Cross-site requests: a plain HTML form (or a `no-cors` fetch) posts to the server, a
  multipart upload to `/v1/audio/transcriptions` included; no CORS preflight stops those,
  and a keyless server has nothing else that would. A request that changes state (any
  method but GET, HEAD and OPTIONS) or opens a WebSocket (browsers apply no CORS to those)
  and carries an `Origin` must come from this machine, from the server's own origin (the
  workbench), or from `server.cors_origins`: else 403. Clients that are not browsers
  send no `Origin` and are not affected.

`cors_origins: ["*"]` lets any page call the server anyway, so with it neither is checked.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from modelpool.config.schema import ServerConfig
from modelpool.errors import HostNotAllowed, ModelpoolError, OriginNotAllowed
from modelpool.server.asgi import refuse_websocket, send_json
from modelpool.wire.errors import shaped_error
from modelpool.wire.openai.errors import error_payload

log = logging.getLogger("modelpool.api")
KNOWN_HOSTS = 64
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing (the API keeps them so): any Origin may send them."""


def is_loopback_name(hostname: str | None) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1 (a hostname as `urlsplit` gives it: no brackets, lower case)."""
    if hostname is None:
        return False
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _split(netloc: str) -> SplitResult | None:
    """`host[:port]` as its parts, or None when it cannot be one (a bad port, spaces...)."""
    try:
        parts = urlsplit(f"//{netloc}")
        _ = parts.port  # raises on a port that is not a number in range
    except ValueError:
        return None
    return parts if parts.hostname and " " not in netloc else None


@dataclass(frozen=True)
class HostPattern:
    """One `server.allowed_hosts` entry: a name, `*.suffix` or `*`, and maybe a port."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, entry: str) -> HostPattern:
        parts = _split(entry)
        if parts is None or parts.hostname is None:
            raise ValueError(f"'{entry}' is not a host")
        return cls(parts.hostname, parts.port)

    def matches(self, host: SplitResult) -> bool:
        if self.port is not None and host.port != self.port:
            return False
        name = host.hostname or ""
        if self.host.startswith("*."):
            return name.endswith(self.host[1:])
        return self.host in ("*", name)


@dataclass(frozen=True)
class BrowserRule:
    """What the guard accepts, read once from the server's config."""

    check_hosts: bool
    """Refuse Host headers that are neither loopback names nor in `allowed_hosts`."""
    allowed_hosts: tuple[HostPattern, ...]
    check_origins: bool
    """Refuse foreign Origins on state-changing requests (off only with `*` origins)."""
    cors_origins: frozenset[str]

    @classmethod
    def from_config(cls, server: ServerConfig) -> BrowserRule:
        any_origin = "*" in server.cors_origins
        loopback_bind = is_loopback_name(server.host.strip("[]").lower())
        return cls(
            check_hosts=not any_origin and (loopback_bind or bool(server.allowed_hosts)),
            allowed_hosts=tuple(HostPattern.parse(entry) for entry in server.allowed_hosts),
            check_origins=not any_origin,
            cors_origins=frozenset(server.cors_origins),
        )

    def host_problem(self, host: str | None) -> ModelpoolError | None:
        """A client that sends no Host (HTTP/1.0) is no browser: nothing to refuse."""
        if not self.check_hosts or host is None:
            return None
        parts = _split(host)
        if parts is not None and (is_loopback_name(parts.hostname) or self._listed(parts)):
            return None
        return HostNotAllowed(
            f"Invalid Host header '{host[:100]}': this server answers to loopback names (localhost, 127.0.0.1, "
            "[::1]) and the names in server.allowed_hosts"
        )

    def _listed(self, host: SplitResult) -> bool:
        return any(pattern.matches(host) for pattern in self.allowed_hosts)

    def origin_problem(self, origin: str | None, host: str | None) -> ModelpoolError | None:
        if not self.check_origins or origin is None or origin in self.cors_origins:
            return None
        parts = _split(origin.partition("://")[2]) if "://" in origin else None
        if parts is not None and (is_loopback_name(parts.hostname) or parts.netloc.lower() == (host or "").lower()):
            return None  # a page on this machine, or the server's own page (the workbench)
        return OriginNotAllowed(
            f"Invalid Origin '{origin[:100]}': a web page may change state here only from this machine, from "
            "the server's own origin, or from an origin in server.cors_origins"
        )


class HostGuard:
    """Pure ASGI, outermost: a refused request reaches nothing, its body is never read."""

    def __init__(self, app: ASGIApp, rule: BrowserRule) -> None:
        self.app = app
        self.rule = rule
        self._good_hosts: set[bytes] = set()
        """Host headers already accepted (parsing one costs more than the rest of this check);
        at most KNOWN_HOSTS, so a client sending a new Host each time only takes the long way."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        log.info("refused a request from a browser context", extra={"path": scope.get("path"), "why": problem.code})
        if scope["type"] == "websocket":
            await refuse_websocket(scope, send, problem)
            return
        body = shaped_error(scope["path"], problem.status_code, error_payload(problem))
        await send_json(send, problem.status_code, body)

    def _problem(self, scope: Scope) -> ModelpoolError | None:
        raw_host = raw_origin = None
        for name, value in scope.get("headers", []):
            lowered = name.lower()
            if lowered == b"host":
                raw_host = value
            elif lowered == b"origin":
                raw_origin = value
        host = None if raw_host is None else raw_host.decode("latin-1")
        changes_state = scope["type"] == "websocket" or scope.get("method", "GET") not in SAFE_METHODS
        origin = raw_origin.decode("latin-1") if changes_state and raw_origin is not None else None
        if raw_host not in self._good_hosts:
            problem = self.rule.host_problem(host)
            if problem is not None:
                return problem
            if raw_host is not None and len(self._good_hosts) < KNOWN_HOSTS:
                self._good_hosts.add(raw_host)
        return self.rule.origin_problem(origin, host)
