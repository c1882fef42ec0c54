"""API keys and scopes. `/v1/admin/*` needs the `admin` scope, the other `/v1/*` routes
(and the MCP server at `/mcp`) `inference`; health, readiness and metrics are open. With
no keys configured nothing is checked (and the CLI refuses to bind beyond loopback unless
told to). The caller `RequireKeys` names is read by everyone else from `modelpool/owner.py`."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from modelpool.config.environment import secret
from modelpool.config.schema import AuthConfig, Config, SchedulingClass
from modelpool.config.schema import Scope as KeyScope
from modelpool.errors import AuthenticationFailed, ConfigError, ModelpoolError, PermissionDenied
from modelpool.owner import (
    ANONYMOUS,
    DEFAULT_SCHEDULE,
    INTERNAL_CALLER,
    InternalCall,
    Owner,
    Schedule,
    acting_for,
)
from modelpool.server.asgi import refuse_websocket, send_json
from modelpool.wire.errors import shaped_error
from modelpool.wire.openai.errors import error_payload

log = logging.getLogger("modelpool")


@dataclass(frozen=True)
class Holder:
    name: str
    scopes: frozenset[KeyScope]
    schedule: Schedule = DEFAULT_SCHEDULE
    """The key's class and weight in the models' queues; its party is its name."""


class KeyRing:
    """Known keys by their SHA-256, compared in constant time."""

    def __init__(self, holders: dict[str, Holder], anonymous: SchedulingClass | None = None) -> None:
        self._holders = holders
        self._anonymous = anonymous or SchedulingClass()

    def anonymous_schedule(self, scope: Scope) -> Schedule:
        """Without keys each client address is its own party in the queues."""
        client = scope.get("client")
        where = client[0] if client else "unknown"
        return Schedule(f"address {where}", self._anonymous.priority, self._anonymous.weight)

    @classmethod
    def from_config(cls, auth: AuthConfig, environ: Mapping[str, str] | None = None) -> KeyRing:
        """Secrets are read from the variables the config names (`environ` stands in for the
        process environment in tests)."""
        read = secret if environ is None else environ.get
        holders = {}
        for key in auth.keys:
            if key.key_env is not None:
                value = read(key.key_env)
                if not value:
                    raise ConfigError(f"api key '{key.name}' is read from ${key.key_env}, which is not set")
                digest = hashlib.sha256(value.encode()).hexdigest()
            else:
                digest = (key.sha256 or "").lower()
            holders[digest] = Holder(key.name, frozenset(key.scopes), Schedule(key.name, key.priority, key.weight))
        return cls(holders, auth.unauthenticated_scheduling)

    @property
    def enabled(self) -> bool:
        return bool(self._holders)

    def replace(self, other: KeyRing) -> None:
        """Take `other`'s keys at once (a config reload): a new key works from the next
        request, a removed one is refused from it; priorities and weights change with them."""
        self._holders, self._anonymous = other._holders, other._anonymous

    def identify(self, authorization: str | None) -> Holder | None:
        """The holder of a valid key, or None (no key, or a wrong one)."""
        if not authorization or not authorization.lower().startswith("bearer "):
            return None
        digest = hashlib.sha256(authorization[7:].strip().encode()).hexdigest()
        return next((h for d, h in self._holders.items() if hmac.compare_digest(d, digest)), None)

    def named(self, name: str, needed: KeyScope) -> Holder:
        """The holder of the key called `name`, still configured and with `needed` (the
        server's own work for a key, e.g. a batch line: a key revoked since must stop it)."""
        holder = next((h for h in self._holders.values() if h.name == name), None)
        if holder is None:
            raise AuthenticationFailed(f"The API key '{name}' was revoked.")
        if needed not in holder.scopes:
            raise PermissionDenied(f"This API key ('{name}') lacks the '{needed.value}' scope.")
        return holder

    def check(self, authorization: str | None, needed: KeyScope) -> Holder:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.")
        holder = self.identify(authorization)
        if holder is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        if needed not in holder.scopes:
            raise PermissionDenied(f"This API key ('{holder.name}') lacks the '{needed.value}' scope.")
        return holder


_INFERENCE_ROOTS = (
    "/v1/", "/v2/", "/loglikelihood", "/generate", "/rerank", "/score", "/mcp", "/tokenize", "/detokenize",
    "/embedding",  # and /embeddings: llama-server's
)  # fmt: skip


def needed_scope(path: str) -> KeyScope | None:
    if path.startswith("/v1/admin"):
        return KeyScope.ADMIN
    if path.startswith(_INFERENCE_ROOTS):
        return KeyScope.INFERENCE
    return None


class RequireKeys:
    """Pure ASGI: reject before routing, so no request body is read for a bad key."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        internal = scope.get(INTERNAL_CALLER)
        if isinstance(internal, InternalCall):  # the server's own request (a batch line) for a key checked before
            await self._internal(internal, scope, receive, send)
            return
        needed = needed_scope(scope.get("path", ""))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        owner = ANONYMOUS if not self.keys.enabled else None
        schedule = self.keys.anonymous_schedule(scope)
        if needed is not None and self.keys.enabled:
            try:
                holder = self.keys.check(_credential(headers), needed)
            except ModelpoolError as exc:
                if scope["type"] == "websocket":
                    await refuse_websocket(scope, send, exc)
                    return
                body = shaped_error(scope["path"], exc.status_code, error_payload(exc))
                await send_json(send, exc.status_code, body, exc.headers)
                return
            scope.setdefault("state", {})["key_name"] = holder.name
            owner = Owner(holder.name, admin=KeyScope.ADMIN in holder.scopes)
            schedule = holder.schedule
        elif self.keys.enabled:  # an open route (/readyz): a valid key still says who asks, a bad one is no key
            known = self.keys.identify(_credential(headers))
            owner = None if known is None else Owner(known.name, admin=KeyScope.ADMIN in known.scopes)
        with acting_for(scope, owner, schedule):
            await self.app(scope, receive, send)

    async def _internal(self, internal: InternalCall, scope: Scope, receive: Receive, send: Send) -> None:
        """The key must still exist with the route's scope: a key removed (a reload, a restart)
        since its batch was made is refused, never run as an unknown, unlimited caller."""
        needed = needed_scope(scope.get("path", ""))
        if self.keys.enabled and needed is not None:
            try:
                self.keys.named(internal.owner.name, needed)
            except ModelpoolError as exc:
                body = shaped_error(scope["path"], exc.status_code, error_payload(exc))
                await send_json(send, exc.status_code, body, exc.headers)
                return
        if self.keys.enabled:
            scope.setdefault("state", {})["key_name"] = internal.owner.name
        with acting_for(scope, internal.owner, internal.schedule):
            await self.app(scope, receive, send)


def _credential(headers: Mapping[str, str]) -> str | None:
    """`Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>` (its SDK and agents
    send that one), or on a WebSocket OpenAI's subprotocol `openai-insecure-api-key.<key>`
    (browsers cannot set headers there), as a bearer value."""
    if "authorization" in headers:
        return headers["authorization"]
    key = headers.get("x-api-key") or _subprotocol_key(headers.get("sec-websocket-protocol", ""))
    return f"Bearer {key}" if key else None


def _subprotocol_key(offered: str) -> str | None:
    prefix = "openai-insecure-api-key."
    return next((p.strip()[len(prefix) :] for p in offered.split(",") if p.strip().startswith(prefix)), None)


def check_exposure(config: Config, keys: KeyRing) -> None:
    """No keys means anyone who can reach the port can use (and unload) every model."""
    if keys.enabled or _is_loopback(config.server.host):
        return
    if config.auth.allow_unauthenticated_remote:  # allowed (the container image's default), but never silently
        log.warning(
            "serving with no API keys on a non-loopback address: anyone who can reach it can use, load and "
            "unload every model (configure auth.keys)",
            extra={"host": config.server.host, "port": config.server.port},
        )
        return
    raise ConfigError(
        f"refusing to serve on {config.server.host} without API keys: configure auth.keys, bind to "
        "127.0.0.1, or set auth.allow_unauthenticated_remote: true"
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
