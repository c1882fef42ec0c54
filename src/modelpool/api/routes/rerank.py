"""POST /v1/rerank (and /rerank, /v2/rerank): Cohere's and Jina's rerank; POST /v1/score
(and /score): vLLM's pair scores. Served by rerankers and by any embedding model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import ResponseMeta, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.schemas.rerank import RerankBody, ScoreBody

router = APIRouter()


@router.post("/v1/rerank")
@router.post("/v2/rerank")
@router.post("/rerank")
async def rerank(body: RerankBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    scored, timing = await unless_disconnected(request, pool.score_pairs(body.model, body.to_request(),
                                                                         body.call_options()))  # fmt: skip
    ranked = sorted(range(len(scored.scores)), key=lambda i: -scored.scores[i])  # stable: ties keep input order
    ranked = ranked[: body.top_n] if body.top_n else ranked
    results = []
    for index in ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": scored.scores[index]}
        if body.return_documents:
            result["document"] = body.document(index)
        results.append(result)
    meta = ResponseMeta.new("rerank", pool.model_id(body.model))
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens}
    payload = {"id": meta.id, "model": meta.model, "results": results, "usage": usage}
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})


@router.post("/v1/score")
@router.post("/score")
async def score(body: ScoreBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    scored, timing = await unless_disconnected(request, pool.score_pairs(body.model, body.to_request(),
                                                                         body.call_options()))  # fmt: skip
    meta = ResponseMeta.new("score", pool.model_id(body.model))
    data = [{"index": i, "object": "score", "score": value} for i, value in enumerate(scored.scores)]
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens, "completion_tokens": 0}
    payload = {"id": meta.id, "object": "list", "created": meta.created, "model": meta.model, "data": data,
               "usage": usage}  # fmt: skip
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})
