"""POST /tokenize and /detokenize: a model's own tokenizer, answered in the shape the request
came in (vLLM's or llama-server's; see `schemas.tokenize`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of, unless_disconnected
from modelpool.api.schemas.sizes import limits_of, translated
from modelpool.api.schemas.tokenize import DetokenizeBody, LlamaTokenize, TokenizeBody
from modelpool.inference import TokenPiece
from modelpool.runtime.tokenization import Tokenized

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> JSONResponse:
    if body.model is not None:
        note_model(request, body.model)
    pool = pool_of(request)
    job = await translated(limits_of(request), body.job)
    result = await unless_disconnected(request, pool.tokenize(body.model, job, body.call_options()))
    return JSONResponse(_llama_server(result) if isinstance(body, LlamaTokenize) else _vllm(result))


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, request: Request) -> JSONResponse:
    if body.model is not None:
        note_model(request, body.model)
    pool = pool_of(request)
    result = await unless_disconnected(request, pool.detokenize(body.model, body.tokens, body.call_options()))
    # vLLM's clients read `prompt`, llama-server's `content`; the bodies cannot tell them apart.
    return JSONResponse({"prompt": result.text, "content": result.text})


def _vllm(result: Tokenized) -> dict[str, Any]:
    strs = None if result.pieces is None else [piece.spelling for piece in result.pieces]
    return {"count": len(result.ids), "max_model_len": result.max_model_len, "tokens": result.ids, "token_strs": strs}


def _llama_server(result: Tokenized) -> dict[str, Any]:
    if result.pieces is None:
        return {"tokens": result.ids}
    return {"tokens": [{"id": piece.id, "piece": _piece(piece)} for piece in result.pieces]}


def _piece(piece: TokenPiece) -> str | list[int]:
    """llama-server's rule: the piece as a string when it is valid UTF-8, else its bytes."""
    try:
        return piece.data.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece.data)
