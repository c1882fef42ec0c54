"""GET /v1/models and /v1/models/{id} (`wire.openai.models.model_json`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import pool_of
from modelpool.wire.contract import LISTING_ERRORS, declared
from modelpool.wire.openai.models import model_json, models_json

router = APIRouter(responses=declared(LISTING_ERRORS))

LOADED = Query(
    description="true: only the models loaded now (state `ready`), as llm-pool's /v1/models lists them; "
    "false (the default): every model served, loaded or not."
)


@router.get("/v1/models")
async def list_models(request: Request, loaded: Annotated[bool, LOADED] = False) -> JSONResponse:
    statuses = [s for s in pool_of(request).statuses() if not loaded or s.state == "ready"]
    return JSONResponse(models_json(statuses))


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    return JSONResponse(model_json(pool_of(request).status(model_id)))
