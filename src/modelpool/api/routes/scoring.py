"""POST /loglikelihood and POST /generate: the batch endpoints evaluation harnesses want."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.schemas.scoring import GenerateBody, LoglikelihoodBody
from modelpool.api.schemas.sizes import limits_of, translated

router = APIRouter()


@router.post("/loglikelihood")
async def loglikelihood(body: LoglikelihoodBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    pairs = list(zip(body.prompts, body.continuations, strict=True))
    results = await unless_disconnected(request, pool.loglikelihood(body.model, pairs, body.call_options()))
    scored = sum(r.scored_tokens for r in results)
    return JSONResponse(
        {
            "model": pool.model_id(body.model),
            "ll": [r.logprob for r in results],
            "is_greedy": [r.is_greedy for r in results],
            "usage": {"prompt_tokens": scored, "total_tokens": scored},
        }
    )


@router.post("/generate")
async def generate(body: GenerateBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    requests = await translated(limits_of(request), body.to_requests, pool.sampling_defaults(body.model))
    results = await unless_disconnected(request, pool.generate_all(body.model, requests, body.call_options()))
    prompt_tokens = sum(r.usage.prompt_tokens for r in results)
    completion_tokens = sum(r.usage.completion_tokens for r in results)
    return JSONResponse(
        {
            "model": pool.model_id(body.model),
            "completions": [r.text for r in results],
            "finish_reasons": [r.finish_reason for r in results],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )
