"""llama-server's own embedding routes, `POST /embedding` and `POST /embeddings` (not
OpenAI's shape): a body of `content` (or, on `/embeddings`, OpenAI's `input`) and no
`model`, answered as a list of `{index, embedding}` whose `embedding` is a list of vectors.

llama-server returns one vector per token when its model runs with `--pooling none`, else
one pooled vector (in that list of vectors). modelpool's embedding models all pool, so the
list always holds the one pooled vector. `embd_normalize` is llama-server's: -1 none, 0 the
largest component scaled to 32760 (int16's range), 1 taxicab, 2 Euclidean (the default),
p > 2 the p-norm; it applies to what the model returns (a model that normalises its own
vectors, as most sentence-transformers do, is already at unit length before it)."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from modelpool.inference import EmbeddingRequest, EmbeddingResult
from modelpool.wire.common import PoolFields, Text
from modelpool.wire.openai.embeddings import MAX_INPUTS

Texts = Annotated[list[Text], Field(max_length=MAX_INPUTS)]
"""Several texts, each embedded on its own (a text's own length is bounded by the model)."""
MAX_NORM_P = 64
"""The largest p-norm `embd_normalize` may ask for (a larger p is the max norm in all but name)."""
INT16_SCALE = 32760.0
"""llama-server's `embd_normalize: 0`: the largest component becomes this."""


class LlamaEmbeddingBody(PoolFields):
    model: str | None = Field(default=None, min_length=1)
    """llama-server serves one model and its bodies name none: None is the server's default
    embedding model, or the only one (`defaults.models.embedding`)."""
    content: Text | Texts | None = None
    input: Text | Texts | None = None
    """`/embeddings` takes `/v1/embeddings`' options, `input` among them."""
    embd_normalize: int = Field(default=2, ge=-1, le=MAX_NORM_P)
    truncate: bool = False
    """modelpool's: cut over-long inputs to the model's limit instead of a 400."""

    @model_validator(mode="after")
    def _one_text_field(self) -> LlamaEmbeddingBody:
        given = [name for name in ("content", "input") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("send the text to embed in `content` (or `input`), one of the two")
        texts = self.texts()
        if not texts or any(not text for text in texts):
            raise ValueError(f"`{given[0]}` must hold at least one text, and no empty one")
        return self

    def texts(self) -> list[str]:
        value = self.content if self.content is not None else self.input
        return [value] if isinstance(value, str) else list(value or [])

    def to_request(self) -> EmbeddingRequest:
        return EmbeddingRequest(tuple(self.texts()), truncate=self.truncate)


def llama_embeddings_json(body: LlamaEmbeddingBody, result: EmbeddingResult) -> list[dict[str, Any]]:
    """`[{index, embedding: [vector]}]`, each vector normalised as `embd_normalize` says."""
    vectors = normalised(result.vectors.astype(np.float32), body.embd_normalize)
    return [{"index": i, "embedding": [vector.tolist()]} for i, vector in enumerate(vectors)]


def normalised(vectors: npt.NDArray[np.float32], how: int) -> npt.NDArray[np.float32]:
    """Each row divided by its norm of kind `how` (llama-server's `embd_normalize`); a row
    whose norm is 0 stays 0."""
    if how == -1:
        return vectors
    magnitude = np.abs(vectors.astype(np.float64))
    if how == 0:
        norms = magnitude.max(axis=1, keepdims=True) / INT16_SCALE
    elif how == 1:
        norms = magnitude.sum(axis=1, keepdims=True)
    else:  # scaled by the largest component first: a small one raised to p would underflow to 0
        largest = magnitude.max(axis=1, keepdims=True)
        ratios = np.divide(magnitude, largest, out=np.zeros(magnitude.shape), where=largest > 0)
        norms = largest * (ratios**how).sum(axis=1, keepdims=True) ** (1.0 / how)
    scaled = np.divide(vectors, norms, out=np.zeros(vectors.shape), where=norms > 0)
    out: npt.NDArray[np.float32] = scaled.astype(np.float32)
    return out
