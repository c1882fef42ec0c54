"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from modelpool.api.deps import pool_of

router = APIRouter()


@router.get("/healthz")
async def healthz() -> JSONResponse:
    """The process is up and answering."""
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 once every preloaded model is ready; 503 with each model's state before that."""
    ready, states = pool_of(request).readiness()
    body = {"status": "ready" if ready else "not_ready", "models": states}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(pool_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
