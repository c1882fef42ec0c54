"""/readyz with the error envelope, and `?model=` readiness of one model — with fake
backends whose loads the test opens by hand (no sleeps, no real weights)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.config import load_config
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot
from modelpool.server.app import create_app
from tests.fakes import FakeBackend, fake_slot, pool_of


@pytest.fixture
async def pool_app() -> AsyncIterator[tuple[httpx.AsyncClient, asyncio.Event, ModelPool]]:
    gate = asyncio.Event()
    metrics = Metrics()
    slots = [
        fake_slot(FakeBackend(gate), "slow", metrics=metrics),
        fake_slot(FakeBackend(), "lazy", metrics=metrics, preload=False, aliases=["lazy-alias"]),
        fake_slot(FakeBackend(), "manual", metrics=metrics, preload=False, autoload=False),
        fake_slot(FakeBackend(fail_with=RuntimeError("CUDA out of memory")), "broken", metrics=metrics, preload=False),
    ]
    async with _serving(slots, metrics) as (client, pool):
        yield client, gate, pool
        gate.set()


@pytest.fixture
async def failing_preload() -> AsyncIterator[tuple[httpx.AsyncClient, ModelPool]]:
    metrics = Metrics()
    slots = [
        fake_slot(FakeBackend(), "fine", metrics=metrics),
        fake_slot(FakeBackend(fail_with=RuntimeError("weights are corrupt")), "ghost", metrics=metrics),
    ]
    async with _serving(slots, metrics) as (client, pool):
        yield client, pool


@contextlib.asynccontextmanager
async def _serving(slots: Sequence[ModelSlot], metrics: Metrics) -> AsyncIterator[tuple[httpx.AsyncClient, ModelPool]]:
    pool = pool_of(*slots, model_wait_s=0)
    app = create_app(load_config(environ={}, cli={"starter_models": False}), pool)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield client, pool


async def test_not_ready_carries_the_envelope_beside_the_states(pool_app) -> None:
    client, gate, pool = pool_app
    response = await client.get("/readyz")
    assert response.status_code == 503 and int(response.headers["retry-after"]) > 0
    body = response.json()
    assert body["status"] == "not_ready" and body["models"]["slow"] == "loading"
    assert body["error"]["code"] == "model_not_ready" and body["error"]["type"] == "server_error"
    assert "'slow' (loading)" in body["error"]["message"]
    gate.set()
    await pool.slot("slow").ensure_ready(None)
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and "error" not in ready.json()


async def test_a_failed_preload_is_model_load_error_with_the_reason(failing_preload) -> None:
    client, pool = failing_preload
    await asyncio.gather(pool.slot("ghost").ensure_ready(None), return_exceptions=True)
    response = await client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["models"] == {"fine": "ready", "ghost": "failed"}
    assert body["error"]["code"] == "model_load_error" and "weights are corrupt" in body["error"]["message"]
    fine = await client.get("/readyz", params={"model": "fine"})
    assert fine.status_code == 200  # one model can be ready while the server is not


async def test_model_readiness_by_id_or_alias(pool_app) -> None:
    client, gate, pool = pool_app
    loading = await client.get("/readyz", params={"model": "slow"})
    assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_not_ready"
    on_demand = await client.get("/readyz", params={"model": "lazy-alias"})
    assert on_demand.status_code == 200 and on_demand.json()["models"]["lazy"] == "unloaded"
    manual = await client.get("/readyz", params={"model": "manual"})
    assert manual.status_code == 503 and "autoload off" in manual.json()["error"]["message"]
    gate.set()
    await pool.slot("slow").ensure_ready(None)
    assert (await client.get("/readyz", params={"model": "slow"})).status_code == 200


async def test_model_that_failed_to_load_is_model_load_error(pool_app) -> None:
    client, _, pool = pool_app
    await asyncio.gather(pool.slot("broken").ensure_ready(None, explicit=True), return_exceptions=True)
    response = await client.get("/readyz", params={"model": "broken"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "model_load_error" and "CUDA out of memory" in error["message"]


async def test_unknown_model_is_404_model_not_found(pool_app) -> None:
    client, _, _ = pool_app
    response = await client.get("/readyz", params={"model": "nope"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model") and "slow" in error["message"]


async def test_a_closing_pool_is_not_ready() -> None:
    pool = pool_of(fake_slot(FakeBackend(), "m"), model_wait_s=0)
    await pool.close()
    problem = pool.readiness_problem("m")
    assert problem is not None and problem.code == "shutting_down"


async def test_health_is_the_simple_inference_servers_check(pool_app) -> None:
    """Its README: `GET /health` — liveness/readiness, 503 while not ready."""
    client, gate, pool = pool_app
    loading = await client.get("/health")
    assert loading.status_code == 503 and loading.json()["status"] == "unavailable"
    assert loading.json()["error"]["code"] == "model_not_ready" and "Retry-After" in loading.headers
    gate.set()
    await pool.slot("slow").ensure_ready(None)
    ready = await client.get("/health")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"
