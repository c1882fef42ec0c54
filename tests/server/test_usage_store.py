"""The durable usage store as a server gets it: on by default, one server per file (a second
keeps usage in memory and says so), and `/v1/admin/usage`'s hour windows read from it."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from modelpool.config import load_config
from modelpool.pool_api.usage import RequestUsage
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.server.app import create_app
from tests.conftest import BASE_URL

HOUR = 3600
T0 = 1_700_000_000 // HOUR * HOUR


def app_for(**cli: object) -> FastAPI:
    return create_app(load_config(None, cli={"starter_models": False, **cli}, environ={}))


def store_of(app: FastAPI) -> UsageStore | None:
    store: UsageStore | None = app.state.usage_history
    return store


def test_the_store_is_on_by_default_each_test_app_on_a_file_of_its_own(own_usage_files: Path) -> None:
    first, second = store_of(app_for()), store_of(app_for())
    assert first is not None and second is not None
    assert first.path != second.path and {first.path.parent.parent, second.path.parent.parent} == {own_usage_files}
    assert store_of(app_for(usage_store={"enabled": False})) is None


async def test_a_second_server_on_a_locked_file_keeps_usage_in_memory_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = {"usage_store": {"path": str(tmp_path / "usage.sqlite")}}
    first = app_for(**shared)
    async with LifespanManager(first):
        with caplog.at_level(logging.WARNING, logger="modelpool.server.ratelimit"):
            second = app_for(**shared)
        assert store_of(first) is not None and store_of(second) is None
        (warning,) = [r for r in caplog.records if r.name == "modelpool.server.ratelimit"]
        assert "in use by another modelpool server" in warning.getMessage()
        assert str(tmp_path / "usage.sqlite") in warning.getMessage()
        async with LifespanManager(second), client(second) as http:  # it serves, in memory
            assert (await http.get("/v1/admin/usage")).status_code == 200
            refused = await http.get("/v1/admin/usage", params={"start_time": 0})
            assert refused.status_code == 400 and "usage_store" in refused.json()["error"]["message"]
    third = app_for(**shared)  # the first closed its store: the file is free again
    assert store_of(third) is not None
    async with LifespanManager(third):
        pass


async def test_admin_usage_windows_are_read_from_the_store(tmp_path: Path) -> None:
    app = app_for(usage_store={"path": str(tmp_path / "usage.sqlite")})
    store = store_of(app)
    assert store is not None
    wall = [T0 + 60.0]
    store.wall = lambda: wall[0]
    async with LifespanManager(app), client(app) as http:
        app.state.usage.record("alice", RequestUsage(input_tokens=2, output_tokens=3), "chat")
        wall[0] = T0 + 2 * HOUR + 60
        app.state.usage.record("alice", RequestUsage(input_tokens=7), "embed")

        async def windowed(**params: int | str) -> list[tuple[object, ...]]:
            reply = await http.get("/v1/admin/usage", params=params)
            assert reply.status_code == 200, reply.text
            return [(r["key"], r.get("model"), r["requests"], r["input_tokens"]) for r in reply.json()["windowed"]]

        assert await windowed() == [("alice", None, 2, 9)]
        assert await windowed(start_time=T0, end_time=T0 + HOUR) == [("alice", None, 1, 2)]
        assert await windowed(start_time=T0 + HOUR) == [("alice", None, 1, 7)]
        assert await windowed(end_time=T0 + HOUR, group_by="model") == [("alice", "chat", 1, 2)]
        assert await windowed(start_time=T0 + 3 * HOUR) == []
        bad = await http.get("/v1/admin/usage", params={"start_time": -1})
        assert bad.status_code == 400


async def test_usage_is_kept_under_served_models_not_the_names_clients_invent(tmp_path: Path) -> None:
    """Each distinct model a request names would otherwise be a durable row for good."""
    app = app_for(usage_store={"path": str(tmp_path / "usage.sqlite")},
                  models={"m": {"backend": "tests.fakes:EchoBackend"}})  # fmt: skip
    async with LifespanManager(app), client(app) as http:
        for name in ("m", "no-such-model", "x" * 100_000, "m:no-such-adapter", "other-invented"):
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
            await http.post("/v1/chat/completions", json=body)
        reply = await http.get("/v1/admin/usage", params={"start_time": 0, "group_by": "model"})
        assert reply.status_code == 200, reply.text
        rows = {row["model"]: row["requests"] for row in reply.json()["windowed"]}
    assert rows == {"m": 2, "unknown": 3}


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)
