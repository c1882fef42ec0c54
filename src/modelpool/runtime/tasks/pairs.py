"""Relevance of text pairs on a leased replica (rerank, score): a cross-encoder scores each
pair in batches shared with concurrent requests; an embedding model scores the cosine of
the two texts' vectors, computed once per distinct text through the embedding cache and
batcher."""

from __future__ import annotations

import numpy as np

from modelpool.backends.base import EmbeddingBackend, PairScoringBackend
from modelpool.errors import ContextLengthExceeded
from modelpool.inference import EmbeddingRequest, PairScoreRequest, PairScores
from modelpool.runtime.lease import Lease
from modelpool.runtime.tasks.embedding import embed_on
from modelpool.runtime.tasks.embedding_cache import EmbeddingCache


async def cross_encode_on(lease: Lease[PairScoringBackend], request: PairScoreRequest) -> PairScores:
    backend = lease.backend
    encoded = await backend.prepare_pairs(request)
    batcher = lease.replica.pair_batcher
    scores = await (batcher.run(encoded) if batcher else backend.score_encoded(encoded))
    return PairScores(tuple(float(s) for s in scores), sum(len(pair) for pair in encoded))


async def cosine_on(lease: Lease[EmbeddingBackend], cache: EmbeddingCache, request: PairScoreRequest) -> PairScores:
    texts = list(dict.fromkeys(text for pair in request.pairs for text in pair))  # each distinct text once
    position = {text: index for index, text in enumerate(texts)}
    try:
        result = await embed_on(lease, cache, EmbeddingRequest(tuple(texts), truncate=request.truncate))
    except ContextLengthExceeded as exc:
        raise _renamed(exc, request, texts) from None
    vectors = result.vectors.astype(np.float64)
    norms = np.linalg.norm(vectors, axis=1)
    unit = vectors / np.where(norms == 0, 1.0, norms)[:, None]  # a zero vector scores 0, not NaN
    scores = tuple(float(unit[position[a]] @ unit[position[b]]) for a, b in request.pairs)
    return PairScores(scores, result.prompt_tokens)


def _renamed(exc: ContextLengthExceeded, request: PairScoreRequest, texts: list[str]) -> ContextLengthExceeded:
    """The embedding error names `input[i]` of the distinct texts: name the request's own
    field instead (the first pair holding that text)."""
    if not exc.param or not exc.param.startswith("input["):
        return exc
    index = int(exc.param[len("input[") : -1])
    text, param = texts[index], None
    for pair_index, (first, second) in enumerate(request.pairs):
        if text in (first, second):
            param = request.param(pair_index, 1 if text == second else 0)
            break
    message = exc.message.replace(f"input {index}", param or "a text", 1)
    return ContextLengthExceeded(message, param=param)
