"""CORS for browser clients: off unless origins are configured; preflights answered without
a key; every answer to an allowed origin (a 401 included) carries the CORS headers; `*`
with API keys or with credentials refused at load."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.config import load_config
from modelpool.errors import ConfigError
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing

APP = "https://app.example.com"
KEY = "s3cret-key"
MODELS = {"echo": {"backend": "tests.fakes:EchoBackend", "preload": False}}
KEYS = {"keys": [{"name": "app", "key_env": "CORS_TEST_KEY"}]}
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
RATELIMIT_HEADERS = [f"x-ratelimit-{what}-{kind}" for what in ("limit", "remaining", "reset")
                     for kind in ("requests", "tokens")]  # fmt: skip


def preflight(origin: str = APP, method: str = "POST") -> dict[str, str]:
    """What a browser sends before a cross-origin POST with an Authorization header."""
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }


@contextlib.asynccontextmanager
async def served(server: dict[str, Any], auth: dict[str, Any] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    cli = {"starter_models": False, "models": MODELS, "server": server, "auth": auth or {}}
    config = load_config(environ={}, cli=cli)
    app = create_app(config, keys=KeyRing.from_config(config.auth, environ={"CORS_TEST_KEY": KEY}))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client


async def test_cors_is_off_by_default() -> None:
    async with served({}) as client:
        answered = await client.options("/v1/chat/completions", headers=preflight())
        posted = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
    assert "access-control-allow-origin" not in answered.headers
    # A page of an origin not listed may not post at all (server/host_guard.py), CORS or not.
    assert posted.status_code == 403 and posted.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in posted.headers


async def test_a_preflight_is_answered_without_a_key() -> None:
    async with served({"cors_origins": [APP]}, KEYS) as client:
        answered = await client.options("/v1/chat/completions", headers=preflight())
    assert answered.status_code == 200, answered.text
    headers = answered.headers
    assert headers["access-control-allow-origin"] == APP
    assert "POST" in headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-stainless-os"} <= allowed
    assert "access-control-allow-credentials" not in headers  # off unless configured
    assert "Origin" in headers["vary"]


async def test_an_origin_not_listed_gets_no_cors_headers() -> None:
    async with served({"cors_origins": [APP]}, KEYS) as client:
        answered = await client.options("/v1/chat/completions", headers=preflight("https://evil.example"))
        keyed = {"Origin": "https://evil.example", "Authorization": f"Bearer {KEY}"}
        posted = await client.post("/v1/chat/completions", json=CHAT, headers=keyed)
    assert answered.status_code == 400 and "access-control-allow-origin" not in answered.headers
    assert "access-control-allow-origin" not in posted.headers  # the browser keeps the answer from the page


async def test_errors_carry_cors_headers_so_the_page_can_read_them() -> None:
    async with served({"cors_origins": [APP, "http://localhost:5173"]}, KEYS) as client:
        refused = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": APP})
        allowed = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Origin": APP, "Authorization": f"Bearer {KEY}"}
        )
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert refused.headers["access-control-allow-origin"] == APP
    exposed = {h.strip().lower() for h in refused.headers["access-control-expose-headers"].split(",")}
    assert {"x-request-id", "retry-after", "retry-after-ms", *RATELIMIT_HEADERS} <= exposed
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP
    assert allowed.json()["choices"][0]["message"]["content"].strip() == "hi"


async def test_credentials_when_configured() -> None:
    async with served({"cors_origins": [APP], "cors_allow_credentials": True}) as client:
        answered = await client.options("/v1/models", headers=preflight(method="GET"))
        listed = await client.get("/v1/models", headers={"Origin": APP})
    assert answered.headers["access-control-allow-credentials"] == "true"
    assert listed.headers["access-control-allow-credentials"] == "true"
    assert listed.headers["access-control-allow-origin"] == APP  # never `*` with credentials


async def test_any_origin_without_keys() -> None:
    async with served({"cors_origins": ["*"]}) as client:
        listed = await client.get("/v1/models", headers={"Origin": "https://anywhere.example"})
    assert listed.headers["access-control-allow-origin"] == "*"


async def test_any_origin_with_keys_only_when_said() -> None:
    async with served({"cors_origins": ["*"], "cors_allow_any_with_keys": True}, KEYS) as client:
        answered = await client.options("/v1/chat/completions", headers=preflight("https://anywhere.example"))
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    ("server", "auth", "says"),
    [
        ({"cors_origins": ["*"]}, KEYS, "cors_allow_any_with_keys"),
        ({"cors_origins": ["*"], "cors_allow_credentials": True}, {}, "cannot go with cors_allow_credentials"),
        ({"cors_origins": ["https://app.example.com/"]}, {}, "is not an origin"),
        ({"cors_origins": ["app.example.com"]}, {}, "is not an origin"),
    ],
)
def test_unsafe_or_malformed_cors_settings_are_refused_at_load(
    server: dict[str, Any], auth: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(environ={}, cli={"starter_models": False, "server": server, "auth": auth})
