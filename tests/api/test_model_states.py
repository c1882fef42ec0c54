"""How the API answers while a model loads, after it failed, and before readiness — with a
fake backend whose load the test controls (no sleeps, no real weights)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.config import load_config
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.server.app import create_app
from tests.fakes import FakeBackend, fake_slot, pool_of

CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
async def gated() -> AsyncIterator[tuple[httpx.AsyncClient, asyncio.Event, ModelPool]]:
    gate = asyncio.Event()
    metrics = Metrics()
    slots = [
        fake_slot(FakeBackend(gate), "slow", metrics=metrics),
        fake_slot(FakeBackend(fail_with=RuntimeError("CUDA out of memory")), "broken", metrics=metrics, preload=False),
    ]
    pool = pool_of(*slots, model_wait_s=0)
    app = create_app(load_config(environ={}, cli={"starter_models": False}), pool)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client, gate, pool
        gate.set()


async def test_readyz_is_503_until_preloaded_models_are_ready(gated) -> None:
    client, gate, pool = gated
    not_ready = await client.get("/readyz")
    assert not_ready.status_code == 503
    body = not_ready.json()
    assert (body["status"], body["models"]) == ("not_ready", {"slow": "loading", "broken": "unloaded"})
    assert body["error"]["code"] == "model_not_ready"  # the envelope too (tests/api/test_health.py)
    assert (await client.get("/healthz")).status_code == 200  # alive while loading
    gate.set()
    await pool.slot("slow").ensure_ready(None)
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"]["slow"] == "ready"


async def test_request_during_load_gets_model_not_ready_with_retry_after(gated) -> None:
    client, gate, _ = gated
    response = await client.post("/v1/chat/completions", json={"model": "slow", **CHAT})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_not_ready"
    assert int(response.headers["retry-after"]) > 0
    gate.set()


async def test_failed_load_is_503_model_load_error_with_the_reason(gated) -> None:
    client, _, pool = gated
    first = await client.post("/v1/chat/completions", json={"model": "broken", **CHAT})
    assert first.status_code == 503  # it started the load (waiting 0 s for it)
    await asyncio.gather(pool.slot("broken").ensure_ready(None), return_exceptions=True)
    response = await client.post("/v1/chat/completions", json={"model": "broken", **CHAT})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "model_load_error" and "CUDA out of memory" in error["message"]
    listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert listed["broken"]["state"] == "failed" and "CUDA out of memory" in listed["broken"]["error"]
