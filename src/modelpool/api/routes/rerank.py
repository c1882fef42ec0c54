"""POST /v1/rerank (and /rerank, /v2/rerank, and llama-server's /reranking and
/v1/reranking): Cohere's and Jina's rerank; POST /v1/score (and /score): vLLM's pair
scores. Served by rerankers and by any embedding model. A rerank body without `model`
uses the server's default reranker, or the only one."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.inference import PairScores
from modelpool.pool_api.timing import RequestTiming
from modelpool.tasks import Task
from modelpool.wire.contract import MODEL_LIMITS, MODEL_OPTIONAL, POOL_ERRORS, declared
from modelpool.wire.openai.rerank import RerankBody, ScoreBody, rerank_json, score_json

router = APIRouter(responses=declared(POOL_ERRORS))
# Each route lists its own rules: a router's would be listed on every route it holds.
RERANK = declared(rules=(MODEL_LIMITS, MODEL_OPTIONAL))
SCORE = declared(rules=(MODEL_LIMITS, "text_1 and text_2 pair 1:1, 1:N or N:N"))


@router.post("/v1/rerank", responses=RERANK)
@router.post("/v2/rerank", responses=RERANK)
@router.post("/rerank", responses=RERANK)
@router.post("/reranking", responses=RERANK)
@router.post("/v1/reranking", responses=RERANK)
async def rerank(body: RerankBody, request: Request) -> JSONResponse:
    model = pool_of(request).model_for(body.model, Task.RERANK)
    scored, timing = await _scores(model, body, request)
    payload = rerank_json(body, scored, pool_of(request).model_id(model))
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})


@router.post("/v1/score", responses=SCORE)
@router.post("/score", responses=SCORE)
async def score(body: ScoreBody, request: Request) -> JSONResponse:
    scored, timing = await _scores(body.model, body, request)
    payload = score_json(scored, pool_of(request).model_id(body.model))
    return JSONResponse({**payload, **metrics_field(request, body.return_metrics, timing)})


async def _scores(model: str, body: RerankBody | ScoreBody, request: Request) -> tuple[PairScores, RequestTiming]:
    note_model(request, model)
    work = pool_of(request).score_pairs(model, body.to_request(), body.call_options())
    outcome = await unless_disconnected(request, work)
    return outcome.value, outcome.timing
