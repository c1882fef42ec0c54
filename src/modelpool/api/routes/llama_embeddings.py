"""POST /embedding and POST /embeddings: llama-server's own embedding routes (its shape, not
OpenAI's; see `wire.openai.llama_embeddings`). A body without `model` uses the server's
default embedding model, or the only one."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.tasks import Task
from modelpool.wire.contract import MODEL_LIMITS, MODEL_OPTIONAL, POOL_ERRORS, declared
from modelpool.wire.openai.llama_embeddings import LlamaEmbeddingBody, llama_embeddings_json

router = APIRouter(responses=declared(POOL_ERRORS, rules=(MODEL_LIMITS, MODEL_OPTIONAL)))


@router.post("/embedding")
@router.post("/embeddings")
async def llama_embeddings(body: LlamaEmbeddingBody, request: Request) -> JSONResponse:
    pool = pool_of(request)
    model = pool.model_for(body.model, Task.EMBEDDING)
    note_model(request, model)
    outcome = await unless_disconnected(request, pool.embed(model, body.to_request(), body.call_options()))
    return JSONResponse(llama_embeddings_json(body, outcome.value))
