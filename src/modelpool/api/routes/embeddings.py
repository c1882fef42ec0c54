"""POST /v1/embeddings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, declared
from modelpool.wire.openai.embeddings import EmbeddingsBody, embeddings_response, refuse_dimensions_beyond

router = APIRouter(responses=declared(POOL_ERRORS, rules=(MODEL_LIMITS, "`dimensions` the model can make")))


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingsBody, request: Request) -> Response:
    note_model(request, body.model)
    pool = pool_of(request)
    model_id = pool.model_id(body.model)
    if body.dimensions is not None:  # checked before any work; a whole status per request is not free
        refuse_dimensions_beyond(pool.status(body.model).dimensions, body.dimensions, model_id)
    outcome = await unless_disconnected(request, pool.embed(body.model, body.to_request(), body.call_options()))
    result, timing = outcome.value, outcome.timing
    content = embeddings_response(body, result, model_id, metrics_field(request, body.return_metrics, timing))
    return Response(content, media_type="application/json")
