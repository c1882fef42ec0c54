"""Answers straight from ASGI middleware, before (or instead of) the app: a JSON body, a
refused WebSocket handshake; and what a middleware reads of a request's scope."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import Scope, Send

from modelpool.errors import ModelpoolError
from modelpool.wire.openai.errors import error_payload


async def send_json(send: Send, status: int, payload: dict[str, Any], extra: dict[str, str] | None = None) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse_websocket(scope: Scope, send: Send, exc: ModelpoolError) -> None:
    """Refused before accept: the handshake gets the error's status and envelope where the
    server can answer it with an HTTP response (uvicorn can), else a close (then HTTP 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
        return
    body = json.dumps(error_payload(exc)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "websocket.http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


TEMPLATED_ROUTES = (Route, WebSocketRoute, Mount)
"""The kinds of route that have a path template (a Host route has none)."""


def route_template(scope: Scope) -> str | None:
    """The path template of the route the request matched (`/v1/models/{model_id:path}`),
    once routing set it (or the rate limiter, for a request it refused before routing)."""
    route = scope.get("route")
    return route.path if isinstance(route, TEMPLATED_ROUTES) else None


def header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
