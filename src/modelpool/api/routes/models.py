"""GET /v1/models and /v1/models/{id}: OpenAI's fields plus state, tasks and aliases."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import pool_of
from modelpool.runtime.slot import ModelSlot

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [model_json(s) for s in pool_of(request).slots()]})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    return JSONResponse(model_json(pool_of(request).slot(model_id)))


def model_json(slot: ModelSlot) -> dict[str, Any]:
    config = slot.config
    return {
        "id": slot.id,
        "object": "model",
        "created": slot.created,
        "owned_by": config.owned_by,
        "state": slot.state.value,
        "tasks": sorted(task.value for task in slot.tasks),
        "aliases": config.aliases,
        "backend": config.backend,
        "description": config.description,
        "languages": config.options.get("languages"),
        "error": slot.error,
    }
