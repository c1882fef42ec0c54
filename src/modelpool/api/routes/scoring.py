"""POST /loglikelihood and POST /generate: the batch endpoints evaluation harnesses want."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.wire.contract import POOL_ERRORS, declared
from modelpool.wire.openai.scoring import GenerateBody, LoglikelihoodBody, generate_json, loglikelihood_json
from modelpool.wire.sizes import translated

router = APIRouter(responses=declared(POOL_ERRORS))


@router.post("/loglikelihood")
async def loglikelihood(body: LoglikelihoodBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    pairs = list(zip(body.prompts, body.continuations, strict=True))
    results = (await unless_disconnected(request, pool.loglikelihood(body.model, pairs, body.call_options()))).value
    return JSONResponse(loglikelihood_json(pool.model_id(body.model), results))


@router.post("/generate")
async def generate(body: GenerateBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = await translated(limits_of(request), body.to_requests)
    results = (await unless_disconnected(request, pool.generate_all(body.model, requests, body.call_options()))).value
    return JSONResponse(generate_json(pool.model_id(body.model), results))
