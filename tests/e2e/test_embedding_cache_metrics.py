"""The embedding cache's hit and miss counters on /metrics, against the real MiniLM: one
count per input text looked up, as the requests imply."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CHAT_MODEL, EMBED_MODEL, sdk, serving


@pytest.fixture(scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    cli = {"enabled_models": [EMBED_MODEL, CHAT_MODEL], "models": {EMBED_MODEL: {"embedding_cache_size": 8}}}
    async with serving(cli) as (app, client):
        await app.state.pool.slot(EMBED_MODEL).ensure_ready(None)
        yield client


async def cache_counts(http: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    """(hits|misses, model) → count, as Prometheus reads /metrics."""
    text = (await http.get("/metrics")).text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("modelpool_embedding_cache_hits_total", "modelpool_embedding_cache_misses_total"):
                kind = "hits" if "hits" in sample.name else "misses"
                counts[(kind, sample.labels["model"])] = sample.value
    return counts


async def test_counts_one_hit_or_miss_per_input_text(http: httpx.AsyncClient) -> None:
    oai: openai.AsyncOpenAI = sdk(http)
    assert await cache_counts(http) == {("hits", EMBED_MODEL): 0, ("misses", EMBED_MODEL): 0}, (
        "both series from the start, for the model with a cache only"
    )
    await oai.embeddings.create(model=EMBED_MODEL, input=["a red fox", "a blue whale"])  # 2 misses
    await oai.embeddings.create(model=EMBED_MODEL, input=["a red fox", "a green frog"])  # 1 hit, 1 miss
    await oai.embeddings.create(model=EMBED_MODEL, input="a blue whale")  # 1 hit
    assert await cache_counts(http) == {("hits", EMBED_MODEL): 2, ("misses", EMBED_MODEL): 3}


async def test_cosine_scoring_looks_each_distinct_text_up_once(http: httpx.AsyncClient) -> None:
    await sdk(http).embeddings.create(model=EMBED_MODEL, input="a red fox")  # cached now, whatever ran before
    before = await cache_counts(http)
    documents = ["a red fox", "a purple owl", "a purple owl"]  # cached, new, the same new text again
    body = {"model": EMBED_MODEL, "query": "a fox", "documents": documents, "truncate": False}  # the cache's key
    reply = await http.post("/v1/rerank", json=body)
    assert reply.status_code == 200, reply.text
    after = await cache_counts(http)
    key_hits, key_misses = ("hits", EMBED_MODEL), ("misses", EMBED_MODEL)
    assert (after[key_hits] - before[key_hits], after[key_misses] - before[key_misses]) == (1, 2)  # fox; query, owl
