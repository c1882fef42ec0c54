"""OpenAI's Batches API (`/v1/batches`): a file of requests run in the background through
the same routes, as the key that made it, at low priority. Each batch is its key's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from modelpool.owner import owner_of
from modelpool.pool_api.batches import BatchService
from modelpool.wire.contract import declared
from modelpool.wire.openai.batches import CreateBatchBody, ObjectId, batch_json, page_json

router = APIRouter(prefix="/v1/batches")
_CREATE_RULES = ("input_file_id names a file of purpose 'batch' this key may read",)


@router.post("", responses=declared((400, 404), rules=_CREATE_RULES))
async def create_batch(body: CreateBatchBody, request: Request) -> JSONResponse:
    owner = owner_of(request.scope)
    batch = await batches_of(request).create(owner, body.input_file_id, body.endpoint, body.metadata)
    return JSONResponse(batch_json(batch))


@router.get("", responses=declared((400,)))
async def list_batches(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> JSONResponse:
    found = batches_of(request).list(owner_of(request.scope), limit, after)
    return JSONResponse(page_json(found, batch_json))


@router.get("/{batch_id}", responses=declared((400, 404)))
async def retrieve_batch(batch_id: ObjectId, request: Request) -> JSONResponse:
    return JSONResponse(batch_json(batches_of(request).get(batch_id, owner_of(request.scope))))


@router.post("/{batch_id}/cancel", responses=declared((400, 404), rules=("only a batch still running",)))
async def cancel_batch(batch_id: ObjectId, request: Request) -> JSONResponse:
    return JSONResponse(batch_json(await batches_of(request).cancel(batch_id, owner_of(request.scope))))


def batches_of(request: Request) -> BatchService:
    service: BatchService = request.app.state.batches
    return service
