"""POST /v1/embeddings."""

from __future__ import annotations

import base64

import numpy as np
import numpy.typing as npt
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import metrics_field, note_model, pool_of, unless_disconnected
from modelpool.api.schemas.embeddings import EmbeddingsBody
from modelpool.errors import InvalidRequest

router = APIRouter()


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingsBody, request: Request) -> JSONResponse:
    note_model(request, body.model)
    pool = pool_of(request)
    model_id = pool.model_id(body.model)
    result, timing = await unless_disconnected(request, pool.embed(body.model, body.to_request(), body.call_options()))
    dimensions = result.vectors.shape[1]
    if body.dimensions is not None and body.dimensions != dimensions:
        raise InvalidRequest(
            f"model '{model_id}' makes {dimensions}-dimensional embeddings and cannot shorten them",
            param="dimensions",
        )
    vectors = result.vectors.astype("<f4", copy=False)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, body.encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    body_json = {"object": "list", "data": data, "model": model_id, "usage": usage}
    return JSONResponse({**body_json, **metrics_field(request, body.return_metrics, timing)})


def _encode(vector: npt.NDArray[np.float32], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    floats: list[float] = vector.tolist()
    return floats
