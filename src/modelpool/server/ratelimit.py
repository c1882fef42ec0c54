"""Rate limits and usage per API key on the inference routes (pure ASGI).

Runs inside `RequireKeys`, which names the key (`scope["state"]["key_name"]`; none when no
keys are configured: the caller is then `anonymous`, limited per client address). Before
any work a request takes one from its caller's requests budget, or gets 429
`rate_limit_exceeded` in its protocol's error shape with Retry-After (the refused limit
and the route it asked for go on the request's scope, for its trace). The request's
`UsageMeter` goes on its scope (`USAGE_METER`): its route charges every result the pool
returns to it (an `Outcome`'s usage, a stream's as it grows: a prompt at admission, output
as it is generated). What the meter holds is charged to the caller's tokens budget on
every message the response sends (so requests let in meanwhile see what responses in
flight have used) and when it ends, and its usage goes to the ledger.

Every response of a limited caller carries OpenAI's `x-ratelimit-{limit,remaining,reset}-
{requests,tokens}` for the limits that are set (a streamed reply's remaining-tokens counts
its prompt, known as it starts, but not its output). Callers without limits get no headers
and skip the buckets. A WebSocket session is one request: limited at its handshake,
charged as it sends, its usage booked at its end.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelpool.config.schema import Config
from modelpool.config.schema import Scope as KeyScope
from modelpool.config.sources import HubLocation
from modelpool.errors import ConfigError, RateLimited
from modelpool.pool_api.usage import USAGE_METER, LimitState, UsageMeter
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.runtime.ratelimit.limiter import Caller, RateLimiter, duration_text
from modelpool.runtime.ratelimit.usage import UsageLedger
from modelpool.runtime.ratelimit.usage_lock import LockedUsageStore, UsageFileLock
from modelpool.server.asgi import TEMPLATED_ROUTES, send_json
from modelpool.server.auth import needed_scope
from modelpool.wire.errors import shaped_error
from modelpool.wire.openai.errors import error_payload

log = logging.getLogger(__name__)
_STARTS = ("http.response.start", "websocket.accept")
REFUSED_LIMIT = "rate_limited"
"""The scope state's entry naming the limit that refused the request (`requests`, `tokens`)."""


def add_rate_limits(
    app: FastAPI, config: Config, metrics: Metrics, model_label: Callable[[str], str]
) -> UsageStore | None:
    """The limiter and ledger on `app.state` (the admin route reports them; tests move the
    limiter's clock), and the middleware in its place: add it before `RequireKeys`. With
    `usage_store.enabled` (the default), the durable store too, usage and budgets restored
    from it (the lifespan starts and closes it). `model_label`: the model a request's usage
    is kept under (the pool's `metrics_label`)."""
    app.state.rate_limiter = RateLimiter.from_config(config.auth)
    app.state.usage = UsageLedger(metrics)
    app.state.usage_history = _durable_store(config, app.state.usage, app.state.rate_limiter)
    app.add_middleware(EnforceRateLimits, limiter=app.state.rate_limiter, ledger=app.state.usage, routes=app.routes,
                       model_label=model_label)  # fmt: skip
    return app.state.usage_history  # type: ignore[no-any-return]


def default_usage_path(config: Config) -> Path:
    """Where usage is kept when `usage_store.path` is unset: `usage.sqlite` under `work_dir`
    (the tests give each app its own file here)."""
    return (config.work_dir or HubLocation.work_dir) / "usage.sqlite"


def _durable_store(config: Config, ledger: UsageLedger, limiter: RateLimiter) -> UsageStore | None:
    """The store on `usage_store`'s file, its totals and budgets restored; None when off, or
    when another server holds the file (warned: usage then lives in memory, never shared)."""
    settings = config.usage_store
    if not settings.enabled:
        return None
    path = (settings.path or default_usage_path(config)).expanduser()
    lock = UsageFileLock(path)
    try:
        if not lock.acquire():
            log.warning(
                "usage_store: %s is in use by another modelpool server; this one keeps usage and "
                "rate-limit budgets in memory (lost at restart). Give each server its own "
                "usage_store.path, or set usage_store.enabled: false",
                path,
            )
            return None
        store = LockedUsageStore(path, ledger, limiter, settings.flush_interval_s)
        store.lock = lock
        store.restore()
    except (OSError, sqlite3.Error) as exc:
        lock.release()
        raise ConfigError(f"usage_store.path: cannot use {path}: {exc}") from exc
    return store


@dataclass
class _Bill:
    caller: Caller
    meter: UsageMeter
    charged: int = 0
    """Tokens of the meter's total charged to the caller's budget so far."""


class EnforceRateLimits:
    def __init__(
        self,
        app: ASGIApp,
        limiter: RateLimiter,
        ledger: UsageLedger,
        routes: list[BaseRoute] | None = None,
        model_label: Callable[[str], str] = lambda name: "unknown",
    ) -> None:
        """`routes`: the app's, to name the route of a refused request (it never reaches
        routing). `model_label`: a served model's id for the name a request asked for, a
        fixed one for any other, so that invented names cannot grow the (durable) usage
        records without bound."""
        self.app = app
        self.limiter = limiter
        self.ledger = ledger
        self.routes = routes or []
        self.model_label = model_label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _limited(scope):
            await self.app(scope, receive, send)
            return
        caller = self.limiter.caller(scope.get("state", {}).get("key_name"), _address(scope))
        if caller.limits.any:
            try:
                self.limiter.admit(caller)
            except RateLimited as exc:
                self.ledger.refused(caller.account, exc.type)
                self._note_refusal(scope, exc)
                await self._refuse(scope, send, exc, caller)
                return
        bill = _Bill(caller, UsageMeter())
        scope.setdefault("state", {})[USAGE_METER] = bill.meter
        try:
            await self.app(scope, receive, self._with_headers(send, bill) if caller.limits.any else send)
        finally:
            self._settle(bill)
            asked = scope.get("state", {}).get("model_id")
            model = self.model_label(asked) if isinstance(asked, str) else ""
            self.ledger.record(caller.account, bill.meter.total(), model)

    def _with_headers(self, send: Send, bill: _Bill) -> Send:
        async def send_with_headers(message: Message) -> None:
            # Every message settles what was counted by then: a whole reply's headers count its
            # own tokens, and a stream (or a WebSocket session) is charged as it goes.
            self._settle(bill)
            if message["type"] in _STARTS:
                message["headers"] = [*message.get("headers", []), *_encoded(self.limiter.states(bill.caller))]
            await send(message)

        return send_with_headers

    def _settle(self, bill: _Bill) -> None:
        """Charge the tokens counted since the last settling."""
        total = bill.meter.total().total_tokens
        if total != bill.charged:
            self.limiter.charge(bill.caller, total - bill.charged)
            bill.charged = total

    def _note_refusal(self, scope: Scope, exc: RateLimited) -> None:
        """For the request's trace and metrics: the limit that refused it, and the route it
        asked for (routing never ran; the route is left unset when none matches)."""
        scope.setdefault("state", {})[REFUSED_LIMIT] = exc.type
        for route in _flattened(self.routes):
            if route.matches(scope)[0] is Match.FULL:
                if isinstance(route, TEMPLATED_ROUTES):  # a template to name it by
                    scope["route"] = route  # as routing would have set it
                return

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


def _flattened(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes themselves: newer FastAPI keeps an included router as one entry, whose
    routes it matches inside (`original_router`); older versions list them."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _flattened(inner.routes)
        else:
            yield route


def _limited(scope: Scope) -> bool:
    """An inference route's request. Reading the model list (`GET /v1/models`, `/v1/models/{id}`),
    files and batches is metadata, not inference: neither limited nor counted as usage, so a
    client (the workbench's models page, a batch's poller) may poll it without spending the
    key's budget."""
    if scope["type"] not in ("http", "websocket") or needed_scope(scope["path"]) is not KeyScope.INFERENCE:
        return False
    path: str = scope["path"]
    listing = (path == "/v1/models" or path.startswith(_READ_FREELY)) and not path.endswith("/content")
    return not (listing and scope.get("method") in ("GET", "HEAD"))


_READ_FREELY = ("/v1/models/", "/v1/files", "/v1/batches")
"""Reads that are metadata (a model, a file, a batch's progress): a client polls them freely.
A file's content (`/v1/files/{id}/content`, up to `batch_api.max_file_bytes`) is not: each
download is a request of the key's budget."""


def _address(scope: Scope) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None
