"""POST /v1/embeddings: the request body and the list of embeddings it gets back."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
from pydantic import Field, field_validator

from modelpool.errors import GenerationFailed, InvalidRequest
from modelpool.inference import EmbeddingRequest, EmbeddingResult
from modelpool.wire.common import PoolFields, Text

EmbeddingInput = Text | list[Text] | list[int] | list[list[int]]
MAX_INPUTS = 2048
MAX_DIMENSIONS = 65536
"""Above any embedding model's size: `dimensions` past it is refused before any work."""


class EmbeddingsBody(PoolFields):
    model: str = Field(min_length=1)
    input: EmbeddingInput = Field(json_schema_extra={"minLength": 1, "minItems": 1,
                                                     "items": {"minLength": 1, "minItems": 1}})  # fmt: skip
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=MAX_DIMENSIONS)
    """OpenAI's: the first `dimensions` components, re-normalised to unit length (Matryoshka
    truncation, as text-embedding-3 does). 1 to the model's own size; above it, a 400."""
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
    """OpenAI's list of embeddings, floats or base64 little-endian float32 as asked,
    shortened to `dimensions` when the request asks."""
    return _embeddings(body, result, model_id, _encode)


def embeddings_response(body: EmbeddingsBody, result: EmbeddingResult, model_id: str, extra: dict[str, Any]) -> bytes:
    """`embeddings_json` plus `extra` fields, as JSON bytes, rendered by orjson: the same
    numbers as json.dumps of the float list (each float32 widened to float64, written in
    its shortest round-trip form) at a tenth of the cost, which a burst of one-sentence
    requests pays once each. A vector with NaN or infinity has no JSON form: an error."""
    if not np.isfinite(result.vectors).all():
        raise GenerationFailed(f"model '{model_id}' returned an embedding with NaN or infinite values")
    content = {**_embeddings(body, result, model_id, _encode_for_orjson), **extra}
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def _embeddings(
    body: EmbeddingsBody, result: EmbeddingResult, model_id: str, encode: Callable[[npt.NDArray[np.float32], str], Any]
) -> dict[str, Any]:
    vectors = shortened(result.vectors, body.dimensions, model_id).astype("<f4", copy=False)
    data = [
        {"object": "embedding", "index": i, "embedding": encode(vector, body.encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return {"object": "list", "data": data, "model": model_id, "usage": usage}


def shortened(vectors: npt.NDArray[np.float32], dimensions: int | None, model_id: str) -> npt.NDArray[np.float32]:
    """The first `dimensions` components of each vector, scaled back to unit length (OpenAI's
    `dimensions`: Matryoshka truncation). None or the model's own size: unchanged. More than
    the model makes: a 400 naming `dimensions`. A row that truncates to all zeros stays zero."""
    native = vectors.shape[1]
    if dimensions is None or dimensions == native:
        return vectors
    refuse_dimensions_beyond(native, dimensions, model_id)
    cut = vectors[:, :dimensions].astype(np.float32)
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = np.divide(cut, norms, out=np.zeros_like(cut), where=norms > 0)
    return unit


def refuse_dimensions_beyond(native: int | None, dimensions: int | None, model_id: str) -> None:
    """A 400 naming `dimensions` when it asks for more than the model's `native` size
    (None: not known yet, as before an embedding model first loads)."""
    if native is not None and dimensions is not None and dimensions > native:
        raise InvalidRequest(
            f"dimensions ({dimensions}) exceeds the {native} dimensions model '{model_id}' makes; "
            f"ask for 1 to {native}",
            param="dimensions",
        )


def _encode(vector: npt.NDArray[np.float32], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    floats: list[float] = vector.tolist()
    return floats


def _encode_for_orjson(vector: npt.NDArray[np.float32], encoding_format: str) -> npt.NDArray[np.float64] | str:
    """float64, not float32: orjson writes a float32 in float32's shortest form, a different
    number once parsed as a double than the widened value `tolist()` gives."""
    if encoding_format == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    return vector.astype(np.float64)
