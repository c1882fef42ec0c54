"""Issue 27, item 11: open routes tell states, not secrets. With API keys configured, a
caller without one gets from `/readyz` the states it asks about, never a load error's
text (an engine's last output, an upstream's URL) nor the list of every model id; the
interactive docs, which load scripts from a CDN into a page on the server's origin, are off
unless `server.api_docs` turns them on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from modelpool.config import load_config
from modelpool.server.app import create_app
from modelpool.server.auth import KeyRing
from tests.fakes import FakeBackend, fake_slot, pool_of

SECRET = "engine log: listening on http://10.0.0.7:8080/v1 with token hf_abc123"
KEYED = {"starter_models": False, "auth": {"keys": [{"name": "app", "key_env": "OPEN_KEY"}]}}
KEY = {"Authorization": "Bearer sk-open"}


@contextlib.asynccontextmanager
async def served(cli: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    """A `fine` model that loads and a `ghost` whose load fails with a secret in its message."""
    fine = fake_slot(FakeBackend(), "fine")
    ghost = fake_slot(FakeBackend(fail_with=RuntimeError(SECRET)), "ghost", metrics=fine._metrics)
    pool = pool_of(fine, ghost, model_wait_s=0)
    config = load_config(environ={}, cli=cli)
    app = create_app(config, pool, keys=KeyRing.from_config(config.auth, environ={"OPEN_KEY": "sk-open"}))
    async with LifespanManager(app):
        await asyncio.gather(fine.ensure_ready(None), ghost.ensure_ready(None), return_exceptions=True)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client


async def test_readyz_tells_a_caller_without_a_key_states_only() -> None:
    async with served(KEYED) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):  # a wrong key is no key, not a 401
            pool = await client.get("/readyz", headers=headers)
            assert pool.status_code == 503, pool.text
            body = pool.json()
            assert body["status"] == "not_ready" and body["models"] == {}
            assert body["error"]["code"] == "model_load_error" and "Retry-After" in pool.headers
            assert "10.0.0.7" not in pool.text and "hf_abc" not in pool.text and "ghost" not in pool.text
            named = await client.get("/readyz", params={"model": "fine"}, headers=headers)
            assert named.status_code == 200 and named.json()["models"] == {"fine": "ready"}
            unknown = await client.get("/readyz", params={"model": "nope"}, headers=headers)
            assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
            assert "fine" not in unknown.text and "ghost" not in unknown.text


async def test_readyz_tells_a_key_holder_why() -> None:
    async with served(KEYED) as client:
        pool = await client.get("/readyz", headers=KEY)
        unknown = await client.get("/readyz", params={"model": "nope"}, headers=KEY)
    assert pool.status_code == 503 and pool.json()["models"] == {"fine": "ready", "ghost": "failed"}
    assert SECRET in pool.json()["error"]["message"]
    assert unknown.status_code == 404 and "fine, ghost" in unknown.json()["error"]["message"]


async def test_without_keys_configured_readyz_tells_everyone_why() -> None:
    """The keyless loopback default: nobody holds a key, so nobody is told less."""
    async with served({"starter_models": False}) as client:
        pool = await client.get("/readyz")
    assert SECRET in pool.json()["error"]["message"] and pool.json()["models"]["ghost"] == "failed"


async def test_the_interactive_docs_are_off_unless_asked_for() -> None:
    async with served({"starter_models": False}) as client:
        docs, redoc = await client.get("/docs"), await client.get("/redoc")
        schema = await client.get("/openapi.json")
    assert docs.status_code == redoc.status_code == 404
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]
    async with served({"starter_models": False, "server": {"api_docs": True}}) as client:
        docs = await client.get("/docs")
    # What they load, and why they are off by default: scripts from a CDN on this origin.
    assert docs.status_code == 200 and "cdn.jsdelivr.net" in docs.text


async def test_health_is_open_and_tells_a_caller_without_a_key_no_secret() -> None:
    async with served(KEYED) as client:
        anonymous = await client.get("/health")
        holder = await client.get("/health", headers=KEY)
    assert anonymous.status_code == holder.status_code == 503  # open: no 401, with keys configured
    assert anonymous.json()["error"]["code"] == "model_load_error"
    assert "10.0.0.7" not in anonymous.text and "ghost" not in anonymous.text and "fine" not in anonymous.text
    assert SECRET in holder.json()["error"]["message"]


async def test_the_llama_server_and_hrm_routes_need_a_key() -> None:
    """Inference routes new with issue 31 are guarded as every inference route is."""
    async with served(KEYED) as client:
        for path in ("/embedding", "/embeddings", "/reranking", "/v1/reranking", "/generate_stream"):
            refused = await client.post(path, json={"content": "a"})
            assert refused.status_code == 401, f"{path}: {refused.text}"
