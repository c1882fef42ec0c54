"""Live configuration in one process: the config file rewritten, then `POST /v1/admin/reload`
(or the file watch) applies the difference (server/reload.py, runtime/pool_reload.py).
The models are `tests.fakes` echo backends, whose `prefix` option shows which config a
reply came from; the real-model, real-process path is tests/e2e/test_reload.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from modelpool.config.loader import config_files, load_config
from modelpool.runtime.lifecycle import SlotState
from modelpool.runtime.pool import ModelPool
from modelpool.server.app import create_app
from modelpool.server.reload import ConfigSources
from tests.conftest import BASE_URL
from tests.fakes import HeldEchoBackend
from tests.live_server import live_server
from tests.polling import until

ADMIN_KEY, USER_KEY, LATER_KEY = "admin-secret", "user-secret", "later-secret"
HELD = "tests.fakes:HeldEchoBackend"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key(name: str, secret: str, *scopes: str) -> dict[str, Any]:
    return {"name": name, "sha256": sha(secret), "scopes": list(scopes)}


BASE_KEYS = [key("admin", ADMIN_KEY, "admin", "inference"), key("user", USER_KEY, "inference")]


def write(path: Path, models: dict[str, dict[str, Any]], **top: Any) -> None:
    data = {"starter_models": False, "pool": {"reap_interval_s": 0.02}, "auth": {"keys": BASE_KEYS},
            "models": {name: {"backend": HELD, **entry} for name, entry in models.items()}, **top}  # fmt: skip
    path.write_text(yaml.safe_dump(data))


@contextlib.asynccontextmanager
async def served(path: Path, **server: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    cli = {"server": server} if server else None
    config = load_config(path, cli=cli, environ={})
    sources = ConfigSources(lambda: load_config(path, cli=cli, environ={}), config_files(path, environ={}))
    app = create_app(config, sources=sources)
    async with live_server(app) as url:  # a real socket: httpx's ASGI transport would buffer a held stream
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            yield app, client


async def reload(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.post("/v1/admin/reload")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def answer(client: httpx.AsyncClient, model: str, text: str = "hello") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return await client.post("/v1/chat/completions", json=body)


@contextlib.asynccontextmanager
async def held_stream(
    client: httpx.AsyncClient, model: str, text: str, seen: str
) -> AsyncIterator[tuple[AsyncIterator[str], asyncio.Event]]:
    """A streamed chat held open, read up to the first line holding `seen`: the rest of its
    lines, and the gate that lets it finish when set."""
    gate = HeldEchoBackend.gate = asyncio.Event()
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": text}]}
    async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
        lines = stream.aiter_lines()
        while seen not in await anext(lines):
            pass
        yield lines, gate


async def model_ids(client: httpx.AsyncClient) -> set[str]:
    return {model["id"] for model in (await client.get("/v1/models")).json()["data"]}


@pytest.fixture(autouse=True)
def open_gate() -> None:
    HeldEchoBackend.gate = None  # streams run through unless a test holds them


async def test_added_removed_and_hot_models_with_the_reply_as_a_typed_diff(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"a": {"options": {"prefix": "A "}}, "b": {}, "gone": {}})
    async with served(path) as (app, client):
        write(path, {"a": {"options": {"prefix": "A "}}, "b": {"description": "now described", "aliases": ["bee"]},
                     "new": {"options": {"prefix": "N "}}}, server={"port": 9999})  # fmt: skip
        diff = await reload(client)
        assert diff == {
            "object": "config.reload", "added": ["new"], "removed": ["gone"], "reloading": [],
            "hot": [{"id": "b", "fields": ["aliases", "description"]}], "live": [],
            "needs_restart": ["server.port"], "unchanged": 1,
        }  # fmt: skip
        assert await model_ids(client) == {"a", "b", "new"}
        assert (await answer(client, "new")).json()["choices"][0]["message"]["content"].startswith("N hello")
        assert (await answer(client, "bee")).status_code == 200  # the alias took at once
        missing = await answer(client, "gone")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        status = (await client.get("/v1/admin/models/b/status")).json()
        assert status["description"] == "now described"
        assert app.state.config.server.port == 8000  # a restart-only setting stays as started
        assert (await reload(client))["needs_restart"] == ["server.port"]  # and is said again, not forgotten


async def test_a_changed_model_finishes_its_stream_on_the_old_config_then_reloads(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {"options": {"prefix": "old "}}})
    async with served(path) as (app, client):
        HeldEchoBackend.gate = asyncio.Event()
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "one two"}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = stream.aiter_lines()
            seen = [await anext(lines)]
            while "old" not in seen[-1]:
                seen.append(await anext(lines))
            write(path, {"m": {"options": {"prefix": "new "}}})
            diff = await reload(client)
            assert diff["reloading"] == [{"id": "m", "fields": ["options"]}]
            pool: ModelPool = app.state.pool
            assert pool.pending_reloads() == ["m"]  # busy: it keeps its old engine for now
            assert (await client.get("/v1/admin/models/m/status")).json()["reload_pending"] is True
            HeldEchoBackend.gate.set()
            rest = [line async for line in lines]
        words = [json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                 for line in [*seen, *rest] if line.startswith("data: {")]  # fmt: skip
        assert "".join(words).split() == ["old", "one", "two"]
        await until(lambda: not pool.pending_reloads(), "the idle model to take its new config")
        assert [model["reload_pending"] for model in (await client.get("/v1/admin/models")).json()["data"]] == [False]

        async def new_config_answers() -> bool:
            reply = (await answer(client, "m")).json()
            return str(reply["choices"][0]["message"]["content"]).startswith("new hello")

        assert await new_config_answers()


async def test_a_removed_model_drains_its_stream_and_goes(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"keep": {}, "drop": {}})
    async with served(path) as (app, client):
        async with held_stream(client, "drop", "a b", "data: {") as (lines, gate):
            write(path, {"keep": {}})
            assert (await reload(client))["removed"] == ["drop"]
            assert (await answer(client, "drop")).status_code == 404
            pool: ModelPool = app.state.pool
            assert [slot.id for slot in pool.resident_slots()] == ["keep", "drop"]  # draining
            gate.set()
            rest = "".join([line async for line in lines])
        assert "[DONE]" in rest
        await until(lambda: [slot.id for slot in pool.resident_slots()] == ["keep"], "the removed model to go")


async def test_a_request_in_line_for_a_removed_model_gets_404_and_the_model_never_loads_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"keep": {}, "drop": {"max_concurrency": 1}})
    async with served(path) as (app, client):
        pool: ModelPool = app.state.pool
        drop = pool.slot("drop")
        async with held_stream(client, "drop", "a b", "data: {") as (lines, gate):
            in_line = asyncio.create_task(answer(client, "drop", "queued"))
            await until(lambda: drop.admission.waiting == 1, "the second request to wait in line")
            write(path, {"keep": {}})
            assert (await reload(client))["removed"] == ["drop"]
            gate.set()
            rest = "".join([line async for line in lines])
        assert "[DONE]" in rest  # the running one finished
        refused = await in_line
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text
        await until(lambda: [slot.id for slot in pool.resident_slots()] == ["keep"], "the removed model to go")
        assert drop.state is SlotState.UNLOADED and len(drop.replicas) == 0  # not loaded again, unowned
        series = (await client.get("/metrics")).text.splitlines()
        assert not [line for line in series if 'model="drop"' in line and ("_state" in line or "queued" in line)]
        assert 'modelpool_model_state{model="keep",state="unloaded"}' in "\n".join(series)


async def test_the_reload_checks_its_models_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path) as (app, client):
        pool: ModelPool = app.state.pool
        prepare, threads = pool.prepare, []

        def recorded(*args: Any) -> Any:  # resolving an added engine may import torch: seconds
            threads.append(threading.current_thread())
            return prepare(*args)

        monkeypatch.setattr(pool, "prepare", recorded)
        write(path, {"m": {}, "n": {}})
        assert (await reload(client))["added"] == ["n"]
        assert threads and threads[0] is not threading.main_thread()


@pytest.mark.parametrize(
    "content, named",
    [
        ("models: [unclosed", "is not valid YAML"),
        ("starter_models: false\nmodels:\n  m:\n    backend: no_such_engine\n", "no_such_engine"),
        ("starter_models: false\nmodels:\n  m:\n    backend: tests.fakes:HeldEchoBackend\n    max_queue: -1\n",
         "models.m.max_queue"),
        ("a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
         "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
         "f: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n", "values"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "RecursionError"),
    ],
    ids=["yaml", "engine", "bounds", "alias-bomb", "deep"],
)
async def test_an_invalid_file_changes_nothing_and_says_why(tmp_path: Path, content: str, named: str) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {"options": {"prefix": "kept "}}})
    async with served(path) as (_, client):
        path.write_text(content)
        response = await client.post("/v1/admin/reload")
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_config" and named in error["message"], error
        assert "nothing changed" in error["message"]
        assert (await answer(client, "m")).json()["choices"][0]["message"]["content"].startswith("kept hello")


async def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path) as (_, client):
        with path.open("a") as grown:
            grown.write("#" * (9 * 1024**2))
        response = await client.post("/v1/admin/reload")
        assert response.status_code == 400 and "MiB" in response.json()["error"]["message"]


async def test_keys_and_their_limits_apply_at_once_and_reload_needs_admin(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path) as (_, client):
        as_user = {"Authorization": f"Bearer {USER_KEY}"}
        refused = await client.post("/v1/admin/reload", headers=as_user)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "insufficient_scope"
        assert (await client.post("/v1/admin/reload", headers={"Authorization": "Bearer nope"})).status_code == 401
        later = {"Authorization": f"Bearer {LATER_KEY}"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post("/v1/chat/completions", json=body, headers=later)).status_code == 401
        keys = [BASE_KEYS[0], {**key("later", LATER_KEY, "inference"), "requests_per_minute": 1}]
        write(path, {"m": {}}, auth={"keys": keys})
        assert (await reload(client))["live"] == ["auth.keys"]
        assert (await client.post("/v1/chat/completions", json=body, headers=later)).status_code == 200
        limited = await client.post("/v1/chat/completions", json=body, headers=later)
        assert limited.status_code == 429  # its new limit applies too
        assert (await client.post("/v1/chat/completions", json=body, headers=as_user)).status_code == 401


async def test_reloads_are_serialized(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path) as (_, client):
        write(path, {"m": {}, "n": {}})
        first, second = await asyncio.gather(client.post("/v1/admin/reload"), client.post("/v1/admin/reload"))
        assert {first.status_code, second.status_code} == {200}
        diffs = sorted([first.json()["added"], second.json()["added"]])
        assert diffs == [[], ["n"]]  # the second saw the first's result, not a half-applied pool


async def test_the_file_watch_applies_a_change(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path, watch_config=True) as (_, client):
        async with asyncio.timeout(30):
            while "watched" not in await model_ids(client):
                write(path, {"m": {}, "watched": {}})  # again: a write before the watcher started goes unseen
                for _ in range(40):
                    if "watched" in await model_ids(client):
                        break
                    await asyncio.sleep(0.05)


async def test_a_server_without_config_sources_answers_409(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    app = create_app(load_config(path, environ={}))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            response = await client.post("/v1/admin/reload", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 409 and response.json()["error"]["code"] == "reload_unavailable"


async def test_an_unexpected_failure_in_a_background_reload_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "models.yaml"
    write(path, {"m": {}})
    async with served(path) as (app, client):
        pool: ModelPool = app.state.pool
        apply = pool.apply

        def broken(*_: Any) -> None:
            raise RuntimeError("a bug while applying")

        monkeypatch.setattr(pool, "apply", broken)
        write(path, {"m": {}, "n": {}})
        await app.state.reloader._quietly("watch")  # what the file watch and SIGHUP run: it must go on
        assert "a bug while applying" in caplog.text
        monkeypatch.setattr(pool, "apply", apply)
        assert (await reload(client))["added"] == ["n"]


async def test_a_hot_change_beside_a_waiting_reload_leaves_the_engines_settings_to_it(tmp_path: Path) -> None:
    """A second reload that changes only a hot field must not slip the first one's settings
    (here the options and the memory the model is counted at) into the model while its old
    engine still serves."""
    path = tmp_path / "models.yaml"
    write(path, {"m": {"options": {"prefix": "old "}}})
    async with served(path) as (app, client):
        async with held_stream(client, "m", "one", "old") as (lines, gate):
            changed = {"options": {"prefix": "new "}, "memory_bytes": 12345}
            write(path, {"m": changed})
            assert (await reload(client))["reloading"] == [{"id": "m", "fields": ["memory_bytes", "options"]}]
            write(path, {"m": {**changed, "description": "second"}})
            assert (await reload(client))["hot"] == [{"id": "m", "fields": ["description"]}]
            pool: ModelPool = app.state.pool
            slot = pool.slot("m")
            assert slot.config.description == "second"  # the hot field took at once
            assert slot.config.options == {"prefix": "old "}  # the engine's own stay until it reloads
            assert slot.config.memory_bytes is None
            assert pool.pending_reloads() == ["m"]
            gate.set()
            async for _ in lines:
                pass
        await until(lambda: pool.slot("m").config.options == {"prefix": "new "}, "the idle model to reload")
        assert pool.slot("m").config.memory_bytes == 12345
        assert pool.slot("m").config.description == "second"  # the waiting reload took the hot change too
        reply = (await answer(client, "m")).json()
        assert reply["choices"][0]["message"]["content"].startswith("new hello")


async def test_a_hot_change_is_checked_as_at_start_up_and_changes_what_the_model_says_it_does(
    tmp_path: Path,
) -> None:
    path = tmp_path / "models.yaml"
    listening = {"backend": "tests.fakes:SampleCountingTranscriber"}
    write(path, {"m": {}, "ears": listening})
    async with served(path) as (_, client):
        write(path, {"m": {}, "ears": {**listening, "enable_thinking": True}})  # start-up refuses it: so must this
        response = await client.post("/v1/admin/reload")
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_config" and "enable_thinking" in error["message"], error

        def thinking_modes(models: dict[str, Any]) -> list[str]:
            return next(m["capabilities"]["thinking_modes"] for m in models["data"] if m["id"] == "m")

        assert thinking_modes((await client.get("/v1/models")).json()) == []
        write(path, {"m": {"reasoning_parser": "think", "enable_thinking": False}, "ears": listening})
        assert (await reload(client))["hot"] == [{"id": "m", "fields": ["enable_thinking", "reasoning_parser"]}]
        models = (await client.get("/v1/models")).json()
        assert thinking_modes(models) == ["default", "enabled", "disabled"]
        assert next(m for m in models["data"] if m["id"] == "m")["capabilities"]["thinking_default"] is False


async def test_a_model_busy_past_reload_wait_s_is_drained_and_what_waits_gets_the_new_config(tmp_path: Path) -> None:
    """Steady traffic (here: a request waiting behind a held stream, so the model is never
    idle) must not keep the old config serving for ever."""
    path = tmp_path / "models.yaml"
    write(path, {"m": {"options": {"prefix": "old "}, "max_concurrency": 1}}, pool={"reap_interval_s": 0.02,
                                                                                   "reload_wait_s": 0.2})  # fmt: skip
    async with served(path) as (app, client):
        async with held_stream(client, "m", "one", "old") as (lines, gate):
            waiting = asyncio.create_task(answer(client, "m"))  # queued behind the held stream
            pool: ModelPool = app.state.pool
            await until(lambda: pool.slot("m").admission.waiting == 1, "the second request to wait in line")
            write(path, {"m": {"options": {"prefix": "new "}, "max_concurrency": 1}},
                  pool={"reap_interval_s": 0.02, "reload_wait_s": 0.2})  # fmt: skip
            assert (await reload(client))["reloading"] == [{"id": "m", "fields": ["options"]}]
            await until(lambda: pool.slot("m").state is SlotState.UNLOADING, "the busy model to drain")
            gate.set()
            rest = "".join([line async for line in lines])
        assert "[DONE]" in rest  # the running stream finished on the old engine
        reply = (await waiting).json()
        assert reply["choices"][0]["message"]["content"].startswith("new hello"), reply
