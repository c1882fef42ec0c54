"""Rate limits and usage per API key on the inference routes (pure ASGI).

Runs inside `RequireKeys`, which names the key (`scope["state"]["key_name"]`; none when no
keys are configured: the caller is then `anonymous`, limited per client address). Before
any work a request takes one from its caller's requests budget, or gets 429
`rate_limit_exceeded` in its protocol's error shape with Retry-After. While it runs, the
runtime adds its tokens and audio to a `RequestUsage` set here in a context variable; its
tokens are charged to the caller's tokens budget as the response starts (a non-streamed
reply's are all known by then) and the rest when it ends, and its usage goes to the ledger.

Every response of a limited caller carries OpenAI's `x-ratelimit-{limit,remaining,reset}-
{requests,tokens}` for the limits that are set (a streamed reply's remaining-tokens is
from before its own tokens). Callers without limits get no headers and skip the buckets.
A WebSocket session is one request: limited at its handshake, its usage booked at its end.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelpool.api.auth import needed_scope
from modelpool.api.errors import error_payload, shaped_error
from modelpool.api.middleware import send_json
from modelpool.config.schema import AuthConfig
from modelpool.config.schema import Scope as KeyScope
from modelpool.errors import RateLimited
from modelpool.runtime.metrics import Metrics
from modelpool.runtime.ratelimit import Caller, KeyReport, LimitState, RateLimiter, duration_text
from modelpool.runtime.usage import RequestUsage, UsageLedger, current_usage

_STARTS = ("http.response.start", "websocket.accept")


def add_rate_limits(app: FastAPI, auth: AuthConfig, metrics: Metrics) -> None:
    """The limiter and ledger on `app.state` (the admin route reports them; tests move the
    limiter's clock), and the middleware in its place: add it before `RequireKeys`."""
    app.state.rate_limiter = RateLimiter.from_config(auth)
    app.state.usage = UsageLedger(metrics)
    app.add_middleware(EnforceRateLimits, limiter=app.state.rate_limiter, ledger=app.state.usage)


@dataclass
class _Bill:
    caller: Caller
    usage: RequestUsage
    charged: int = 0
    """Tokens of `usage` charged to the caller's budget so far."""


class EnforceRateLimits:
    def __init__(self, app: ASGIApp, limiter: RateLimiter, ledger: UsageLedger) -> None:
        self.app = app
        self.limiter = limiter
        self.ledger = ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or needed_scope(scope["path"]) is not KeyScope.INFERENCE:
            await self.app(scope, receive, send)
            return
        caller = self.limiter.caller(scope.get("state", {}).get("key_name"), _address(scope))
        if caller.limits.any:
            try:
                self.limiter.admit(caller)
            except RateLimited as exc:
                self.ledger.refused(caller.account, exc.type)
                await self._refuse(scope, send, exc, caller)
                return
        bill = _Bill(caller, RequestUsage())
        token = current_usage.set(bill.usage)
        try:
            await self.app(scope, receive, self._with_headers(send, bill) if caller.limits.any else send)
        finally:
            current_usage.reset(token)
            self._settle(bill)
            self.ledger.record(caller.account, bill.usage)

    def _with_headers(self, send: Send, bill: _Bill) -> Send:
        async def send_with_headers(message: Message) -> None:
            if message["type"] in _STARTS:
                self._settle(bill)  # so a whole reply's headers count its own tokens
                message["headers"] = [*message.get("headers", []), *_encoded(self.limiter.states(bill.caller))]
            await send(message)

        return send_with_headers

    def _settle(self, bill: _Bill) -> None:
        """Charge the tokens counted since the last settling."""
        self.limiter.charge(bill.caller, bill.usage.total_tokens - bill.charged)
        bill.charged = bill.usage.total_tokens

    async def _refuse(self, scope: Scope, send: Send, exc: RateLimited, caller: Caller) -> None:
        headers = {**exc.headers, **dict(ratelimit_headers(self.limiter.states(caller)))}
        if scope["type"] == "http":
            body = shaped_error(scope["path"], exc.status_code, error_payload(exc))
            await send_json(send, exc.status_code, body, headers)
            return
        if "websocket.http.response" not in scope.get("extensions", {}):  # no way to answer: close (HTTP 403)
            await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
            return
        raw_body = json.dumps(error_payload(exc)).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(raw_body)).encode())]
        raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
        await send({"type": "websocket.http.response.start", "status": exc.status_code, "headers": raw})
        await send({"type": "websocket.http.response.body", "body": raw_body})


def ratelimit_headers(states: list[LimitState]) -> list[tuple[str, str]]:
    """OpenAI's headers for the limits that are set, e.g. `x-ratelimit-reset-tokens: 6m0s`."""
    headers = []
    for state in states:
        headers += [
            (f"x-ratelimit-limit-{state.kind}", str(state.limit)),
            (f"x-ratelimit-remaining-{state.kind}", str(state.remaining)),
            (f"x-ratelimit-reset-{state.kind}", duration_text(state.reset_s)),
        ]
    return headers


def _encoded(states: list[LimitState]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in ratelimit_headers(states)]


def _address(scope: Scope) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None


def usage_json(report: KeyReport) -> dict[str, Any]:
    """One key's row of /v1/admin/usage. `remaining`: per limit, null where unlimited; null
    as a whole for anonymous use, whose budgets are per client address."""
    remaining = None
    if report.remaining is not None:
        left = {state.kind: state.remaining for state in report.remaining}
        remaining = {"requests": left.get("requests"), "tokens": left.get("tokens")}
    return {"key": report.key, **asdict(report.usage), "limits": asdict(report.limits), "remaining": remaining}
