"""The rate-limit middleware charges a response's tokens as it goes: each body message of
an HTTP response and each message of a WebSocket session settles what the request used
so far, so requests admitted meanwhile see the budget that responses in flight spent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from modelpool.errors import RateLimited
from modelpool.pool_api.results import charge
from modelpool.pool_api.usage import USAGE_METER, Limits, RequestUsage
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.runtime.ratelimit.usage import UsageLedger
from modelpool.server.ratelimit import EnforceRateLimits
from tests.fakes import ManualClock
from tests.polling import until
from tests.runtime.ratelimit.test_limiter import outcome


class HeldOpen:
    """An inference app that uses 20 tokens, sends a first piece of its answer, then holds
    the response (or session) open until `release` is set."""

    def __init__(self) -> None:
        self.midway = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            charge(scope["state"][USAGE_METER], outcome(RequestUsage(5, 15)))
            await send({"type": "http.response.body", "body": b"first piece", "more_body": True})
            await self._hold()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send({"type": "websocket.accept"})
            charge(scope["state"][USAGE_METER], outcome(RequestUsage(0, 20)))
            await send({"type": "websocket.send", "text": "first result"})
            await self._hold()
            await send({"type": "websocket.close", "code": 1000})

    async def _hold(self) -> None:
        self.midway.set()
        await self.release.wait()


def scope_of(kind: str, path: str) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": kind, "path": path, "headers": [], "state": {"key_name": "app"},
                             "client": ("10.0.0.1", 1234)}  # fmt: skip
    if kind == "http":
        scope["method"] = "POST"
    return scope


@pytest.mark.parametrize(("kind", "path"), [("http", "/v1/chat/completions"), ("websocket", "/v1/realtime")])
async def test_tokens_in_flight_are_charged_before_the_response_ends(kind: str, path: str) -> None:
    limiter = RateLimiter({"app": Limits(tokens_per_minute=10)}, Limits(), ManualClock())
    ledger = UsageLedger(Metrics())
    inner = HeldOpen()
    middleware = EnforceRateLimits(inner, limiter, ledger)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        raise AssertionError("the app reads nothing")

    caller = limiter.caller("app", None)
    running = asyncio.create_task(middleware(scope_of(kind, path), receive, send))
    try:
        await until(inner.midway.is_set, "the first piece of the answer")
        assert [state.remaining for state in limiter.states(caller)] == [0], "charged as it was sent"
        with pytest.raises(RateLimited) as refused:
            limiter.admit(caller)  # another request of the same key, while this one still runs
        assert refused.value.type == "tokens"
    finally:
        inner.release.set()
        await running
    assert ledger.totals()["app"].output_tokens + ledger.totals()["app"].input_tokens == 20
    assert limiter.states(caller)[0].reset_s == pytest.approx(120.0), "20 tokens over a 10 TPM budget: -10 at most"
