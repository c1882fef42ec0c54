"""A batch line runs through the app as the batch's key, at low priority as a party of its
own: the key middleware takes the server's own `InternalCall` (a client cannot make one),
and the reply comes back with its status, request id, JSON and Retry-After."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from modelpool.api.errors import install_error_handlers
from modelpool.config.schema import AuthConfig, Config
from modelpool.owner import Owner, Priority, Schedule, caller_schedule, owner_of
from modelpool.runtime.batches.database import Database
from modelpool.runtime.batches.files import FileLimits, FileStore
from modelpool.runtime.batches.runner import BatchRunner
from modelpool.server.auth import KeyRing, RequireKeys
from modelpool.server.batches import InProcessCalls, add_batch_api

LIMITS = FileLimits(max_bytes=10_000, max_lines=10, max_line_bytes=1000, key_bytes=100_000, key_files=10)


async def test_a_line_runs_as_its_key_at_low_priority() -> None:
    seen: dict[str, Any] = {}

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        seen.update(owner=owner_of(scope), schedule=caller_schedule(), key=scope["state"].get("key_name"),
                    body=(await receive())["body"])  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"x-request-id", b"req-1"), (b"retry-after", b"2")]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps({"error": {"code": "overloaded"}}).encode()})

    auth = AuthConfig.model_validate({"keys": [{"name": "alice", "key_env": "A", "scopes": ["inference"]}]})
    app = RequireKeys(route, KeyRing.from_config(auth, {"A": "sk-a"}))
    answer = await InProcessCalls(app).call(Owner("alice"), "/v1/chat/completions", b'{"model": "m"}')
    assert seen == {"owner": Owner("alice"), "schedule": Schedule("batch alice", Priority.LOW), "key": "alice",
                    "body": b'{"model": "m"}'}  # fmt: skip
    assert (answer.status_code, answer.request_id, answer.retry_after_s) == (429, "req-1", 2.0)
    assert answer.body == {"error": {"code": "overloaded"}}


async def test_a_client_scope_cannot_claim_to_be_internal() -> None:
    """A real client's request carries no `InternalCall`: the key is checked as always."""
    sent: list[dict[str, Any]] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("not reached without a key")

    async def send(message: Any) -> None:
        sent.append(message)

    auth = AuthConfig.model_validate({"keys": [{"name": "alice", "key_env": "A", "scopes": ["inference"]}]})
    app = RequireKeys(route, KeyRing.from_config(auth, {"A": "sk-a"}))
    scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST", "headers": [],
             "modelpool.internal_caller": Owner("alice")}  # fmt: skip
    await app(scope, _nothing, send)
    assert sent[0]["status"] == 401


async def _nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


async def test_a_key_removed_mid_batch_fails_the_batch_and_runs_nothing_more(tmp_path: Path) -> None:
    """A reload that removes the key: its next line is refused (401, the route is never
    reached as an unknown, unlimited caller) and the batch fails once, `key_revoked`."""
    alice = AuthConfig.model_validate({"keys": [{"name": "alice", "key_env": "A", "scopes": ["inference"]}]})
    bob = AuthConfig.model_validate({"keys": [{"name": "bob", "key_env": "B", "scopes": ["inference"]}]})
    ring = KeyRing.from_config(alice, {"A": "sk-a"})
    reached: list[str | None] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["state"].get("key_name"))
        ring.replace(KeyRing.from_config(bob, {"B": "sk-b"}))  # alice is revoked once her first line ran
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    db = Database(tmp_path / "b.sqlite")
    files = FileStore(db, tmp_path / "files", LIMITS)
    lines = [json.dumps({"custom_id": c, "method": "POST", "url": "/v1/embeddings", "body": {"model": "m"}})
             for c in "abcd"]  # fmt: skip
    source = await files.add(Owner("alice"), "in.jsonl", "batch", io.BytesIO("\n".join(lines).encode()))
    runner = BatchRunner(db, files, lambda endpoint, body: "m", concurrency=1)
    runner.execute = InProcessCalls(RequireKeys(route, ring)).call
    batch = await runner.create(Owner("alice"), source.id, "/v1/embeddings", None)
    await runner.idle()
    assert reached == ["alice"]
    assert batch.status == "failed" and [e.code for e in batch.errors] == ["key_revoked"]
    assert "alice" in batch.errors[0].message and "revoked" in batch.errors[0].message
    db.close()


async def test_a_second_server_on_one_batch_directory_turns_its_batch_api_off(tmp_path: Path) -> None:
    """Two servers resuming the same batches would run their lines twice: the second one to
    start answers 503 on the Batch and Files routes saying why; the directory is free again
    once the first stops."""
    config = Config.model_validate({"batch_api": {"dir": str(tmp_path)}})
    first, second = FastAPI(), FastAPI()
    install_error_handlers(second)
    running, refused = add_batch_api(first, config), add_batch_api(second, config)
    assert running is not None and refused is not None
    running.start()
    refused.start()
    keyless = RequireKeys(second, KeyRing({}))  # the routes ask who calls
    async with httpx.AsyncClient(transport=httpx.ASGITransport(keyless), base_url="http://t") as http:
        upload = {"purpose": "batch"}, {"file": ("in.jsonl", b"{}")}
        for answer in (await http.get("/v1/batches"), await http.post("/v1/files", data=upload[0], files=upload[1]),
                       await http.get("/v1/files"), await http.get("/v1/batches/batch_x")):  # fmt: skip
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "batch_api_unavailable"
            assert "another modelpool server" in answer.json()["error"]["message"]
    await running.close()
    await refused.close()
    again = add_batch_api(FastAPI(), config)
    assert again is not None
    again.start()
    assert again.files.off is None
    await again.close()
