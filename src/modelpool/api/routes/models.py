"""GET /v1/models and /v1/models/{id}: OpenAI's fields plus state, tasks, aliases and the
model's `capabilities`, so a client can decide from data what to send."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import pool_of
from modelpool.runtime.status import ModelStatus

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [model_json(s) for s in pool_of(request).statuses()]})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    return JSONResponse(model_json(pool_of(request).status(model_id)))


def model_json(status: ModelStatus) -> dict[str, Any]:
    capabilities = status.capabilities.as_json()
    return {
        "id": status.id,
        "object": "model",
        "created": status.created,
        "owned_by": status.owned_by,
        "state": status.state,
        "tasks": capabilities["tasks"],
        "aliases": status.aliases,
        "backend": status.backend,
        "description": status.description,
        "languages": capabilities["languages"],
        "capabilities": capabilities,
        "error": status.last_error,
    }
