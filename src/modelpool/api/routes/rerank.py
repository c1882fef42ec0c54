"""POST /v1/rerank (and /rerank, /v2/rerank): Cohere's and Jina's rerank; POST /v1/score
(and /score): vLLM's pair scores. Served by rerankers and by any embedding model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import ResponseMeta, metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.schemas.rerank import RerankBody, ScoreBody
from modelpool.inference import PairScores
from modelpool.runtime.timing import RequestTiming

router = APIRouter()


@router.post("/v1/rerank")
@router.post("/v2/rerank")
@router.post("/rerank")
async def rerank(body: RerankBody, request: Request) -> JSONResponse:
    scored, timing = await _scores(body, request)
    ranked = sorted(range(len(scored.scores)), key=lambda i: -scored.scores[i])  # stable: ties keep input order
    ranked = ranked[: body.top_n] if body.top_n else ranked
    results = []
    for index in ranked:
        result: dict[str, Any] = {"index": index, "relevance_score": scored.scores[index]}
        if body.return_documents:
            result["document"] = body.document(index)
        results.append(result)
    meta = ResponseMeta.new("rerank", pool_of(request).model_id(body.model))
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens}
    payload = {"id": meta.id, "model": meta.model, "results": results, "usage": usage}
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})


@router.post("/v1/score")
@router.post("/score")
async def score(body: ScoreBody, request: Request) -> JSONResponse:
    scored, timing = await _scores(body, request)
    meta = ResponseMeta.new("score", pool_of(request).model_id(body.model))
    data = [{"index": i, "object": "score", "score": value} for i, value in enumerate(scored.scores)]
    usage = {"prompt_tokens": scored.prompt_tokens, "total_tokens": scored.prompt_tokens, "completion_tokens": 0}
    payload = {"id": meta.id, "object": "list", "created": meta.created, "model": meta.model, "data": data,
               "usage": usage}  # fmt: skip
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})


async def _scores(body: RerankBody | ScoreBody, request: Request) -> tuple[PairScores, RequestTiming]:
    note_model(request, body.model)
    work = pool_of(request).score_pairs(body.model, body.to_request(), body.call_options())
    return await unless_disconnected(request, work)
