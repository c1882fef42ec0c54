"""POST /tokenize and /detokenize: a model's own tokenizer, answered in the shape the request
came in (vLLM's or llama-server's; see `wire.openai.tokenize`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.limits import limits_of
from modelpool.wire.contract import MODEL_LIMITS, POOL_ERRORS, declared
from modelpool.wire.openai.tokenize import DetokenizeBody, LlamaTokenize, TokenizeBody, llama_server_tokens, vllm_tokens
from modelpool.wire.sizes import translated

router = APIRouter(responses=declared(POOL_ERRORS, rules=(
    MODEL_LIMITS, "`model` may be left out only when one served model has a tokenizer")))


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> JSONResponse:
    if body.model is not None:
        note_model(request, body.model)
    pool = pool_of(request)
    job = await translated(limits_of(request), body.job)
    result = (await unless_disconnected(request, pool.tokenize(body.model, job, body.call_options()))).value
    return JSONResponse(llama_server_tokens(result) if isinstance(body, LlamaTokenize) else vllm_tokens(result))


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, request: Request) -> JSONResponse:
    if body.model is not None:
        note_model(request, body.model)
    pool = pool_of(request)
    result = (await unless_disconnected(request, pool.detokenize(body.model, body.tokens, body.call_options()))).value
    # vLLM's clients read `prompt`, llama-server's `content`; the bodies cannot tell them apart.
    return JSONResponse({"prompt": result.text, "content": result.text})
