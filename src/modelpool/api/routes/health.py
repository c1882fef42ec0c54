"""Liveness, readiness and Prometheus metrics (and their recent history, for charts)."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from modelpool.api.deps import pool_of
from modelpool.errors import InvalidRequest, ModelNotFound, ModelpoolError
from modelpool.owner import is_keyless_caller
from modelpool.status import MetricsHistoryView
from modelpool.wire.contract import LISTING_ERRORS, declared, not_ready_response, text
from modelpool.wire.openai.errors import error_payload

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """The process is up and answering, and which modelpool it is (`modelpool status`)."""
    return JSONResponse({"status": "ok", "version": request.app.version})


@router.get("/health", responses=declared((503,)))
async def health(request: Request) -> JSONResponse:
    """The simple inference server's liveness/readiness check: 200 `{"status": "ok"}` once
    every preloaded model is ready, else 503 `{"status": "unavailable"}` with the error
    envelope `/readyz` gives. Open, as `/readyz` is, and as careful: no model ids, and the
    reason only to a caller with a valid key."""
    problem = pool_of(request).readiness_problem(None)
    if problem is None:
        return JSONResponse({"status": "ok", "version": request.app.version})
    payload = _told(problem, is_keyless_caller(request.scope))
    return JSONResponse({"status": "unavailable", **payload}, status_code=503, headers=problem.headers)


@router.get("/readyz", responses=declared(LISTING_ERRORS) | {503: not_ready_response()})
async def readyz(request: Request, model: str | None = None) -> JSONResponse:
    """200 once every preloaded model is ready (or, with `?model=ID`, once that model is
    ready or would load on demand); else 503 with each model's state and the error envelope
    a request would get (`model_not_ready`, `model_load_error`). Unknown model → 404.

    Open, but while API keys are configured a caller without a valid one learns states
    only: the pool's (and the model it named), never the reason (engine output, upstream
    URLs) nor the list of model ids."""
    pool = pool_of(request)
    keyless = is_keyless_caller(request.scope)
    try:
        problem = pool.readiness_problem(model)
    except ModelNotFound as exc:
        raise (ModelNotFound(exc.model_id, None) if keyless else exc) from None
    _, states = pool.readiness()
    if keyless:  # the named model's state only: it names no other id
        states = {} if model is None else {pool.model_id(model): states[pool.model_id(model)]}
    body = {"status": "ready" if problem is None else "not_ready", "models": states}
    if problem is None:
        return JSONResponse(body)
    payload = _told(problem, keyless)
    return JSONResponse({**body, **payload}, status_code=problem.status_code, headers=problem.headers)


def _told(problem: ModelpoolError, keyless: bool) -> dict[str, Any]:
    """The envelope; for a caller without a key, its status and code but not its message
    (a load error's message carries the engine's last output or the upstream's URL)."""
    payload = error_payload(problem)
    if keyless:
        payload["error"]["message"] = f"not ready ({problem.code}); send an API key to read why"
    return payload


@router.get("/metrics", response_class=Response, responses=declared(media={"text/plain": text()}))
async def metrics(request: Request) -> Response:
    return Response(pool_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/history", responses=declared(LISTING_ERRORS))
async def metrics_history(request: Request, since: float | None = None) -> JSONResponse:
    """The last 15 minutes of request rate, latency p50/p99, tokens/s, queue depth and
    memory, a point every 2 s (the workbench's charts). `since`: only points after this
    wall-clock time (a client that keeps its own copy asks for what is new); a finite number
    (`nan` compares false with every point and `inf` after all of them: neither is a time)."""
    if since is not None and not math.isfinite(since):
        raise InvalidRequest(f"since must be a finite number of seconds since the epoch, not {since}", param="since")
    history: MetricsHistoryView = request.app.state.metrics_history
    return JSONResponse(history.as_json(since))
