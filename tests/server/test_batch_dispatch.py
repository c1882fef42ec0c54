"""A batch line runs through the app as the batch's key, at low priority as a party of its
own: the key middleware takes the server's own `InternalCall` (a client cannot make one),
and the reply comes back with its status, request id, JSON and Retry-After."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope, Send

from modelpool.config.schema import AuthConfig
from modelpool.owner import Owner, Priority, Schedule, caller_schedule, owner_of
from modelpool.server.auth import KeyRing, RequireKeys
from modelpool.server.batches import InProcessCalls


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
