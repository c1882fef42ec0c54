"""POST /v1/embeddings: the request body and the list of embeddings it gets back."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from modelpool.errors import InvalidRequest
from modelpool.inference import EmbeddingRequest, EmbeddingResult
from modelpool.wire.common import PoolFields, Text

EmbeddingInput = Text | list[Text] | list[int] | list[list[int]]
MAX_INPUTS = 2048


class EmbeddingsBody(PoolFields):
    model: str = Field(min_length=1)
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    truncate: bool = False
    """modelpool extension: cut over-long inputs to the model's limit instead of a 400."""

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: EmbeddingInput) -> EmbeddingInput:
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("input must not be empty")
        if len(items) > MAX_INPUTS and not isinstance(items[0], int):
            raise ValueError(f"at most {MAX_INPUTS} inputs per request")
        for item in items:
            if isinstance(item, str | list) and len(item) == 0:
                raise ValueError("input must not contain empty strings or empty token lists")
        return value

    def to_request(self) -> EmbeddingRequest:
        value = self.input
        if isinstance(value, str):
            inputs: tuple[str | tuple[int, ...], ...] = (value,)
        elif isinstance(value[0], int):
            inputs = (tuple(value),)
        else:
            inputs = tuple(v if isinstance(v, str) else tuple(v) for v in value)
        return EmbeddingRequest(inputs, truncate=self.truncate)


def embeddings_json(body: EmbeddingsBody, result: EmbeddingResult, model_id: str) -> dict[str, Any]:
    """OpenAI's list of embeddings, floats or base64 little-endian float32 as asked; a model
    cannot shorten its vectors, so `dimensions` other than its own is refused."""
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
    return {"object": "list", "data": data, "model": model_id, "usage": usage}


def _encode(vector: npt.NDArray[np.float32], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    floats: list[float] = vector.tolist()
    return floats
