"""Embeddings on a leased replica: the cache first, then one batched engine call for the rest."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from modelpool.backends.base import EmbeddingBackend, TokenEmbeddingBackend, implements
from modelpool.inference import EmbeddingRequest, EmbeddingResult
from modelpool.runtime.lease import Lease
from modelpool.runtime.tasks.embedding_cache import EmbeddingCache


async def embed_on(lease: Lease[EmbeddingBackend], cache: EmbeddingCache, request: EmbeddingRequest) -> EmbeddingResult:
    backend = lease.backend
    if not implements(backend, TokenEmbeddingBackend):  # computed upstream: no local tokens to batch or cache
        return await backend.embed(request)
    ids = await backend.prepare(request)
    keys = [(item, request.truncate) for item in request.inputs]
    found = [cache.get(key) if cache.size else None for key in keys]
    missing = [i for i, hit in enumerate(found) if hit is None]
    rows: dict[int, npt.NDArray[np.float32]] = {i: hit[0] for i, hit in enumerate(found) if hit is not None}
    if missing:
        batcher = lease.replica.batcher
        wanted = [ids[i] for i in missing]
        computed = await (batcher.run(wanted) if batcher else backend.embed_tokens(wanted))
        for i, row in zip(missing, computed, strict=True):
            rows[i] = row
            cache.put(keys[i], row.copy(), len(ids[i]))  # a copy: a view would pin the whole batch
    counts = tuple(len(i) for i in ids)
    vectors = np.stack([rows[i] for i in range(len(ids))]).astype(np.float32, copy=False)
    return EmbeddingResult(vectors, sum(counts), counts)
