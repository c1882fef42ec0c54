"""Rerank (Cohere/Jina shape) and score (vLLM's) on a tiny random-weight cross-encoder
(tests/cross_encoders.py: no reranker weights install here), compared with
sentence-transformers' own `CrossEncoder.predict` on the same folder, and on the real
all-MiniLM-L6-v2 embedding model (cosine), which must rank the relevant passage first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from tests.conftest import CHAT_MODEL, EMBED_MODEL, serving
from tests.cross_encoders import tiny_cross_encoder

RERANKER = "tiny-reranker"
QUERY = "how do cats purr"
DOCUMENTS = [
    "The stock market fell sharply on Tuesday.",
    "Cats purr by vibrating the muscles of their larynx.",
    "A recipe for lemon cake with three eggs.",
    "Purring is a sound made by most species of felids.",
    "",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_cross_encoder(tmp_path_factory.mktemp("reranker") / "tiny-bert-ce")


@pytest.fixture(scope="module")
def predict(folder: Path) -> Any:
    """Scores as sentence-transformers computes them, outside modelpool."""
    from sentence_transformers import CrossEncoder

    with MODEL_CONSTRUCTION:  # the app may be loading its models in other threads meanwhile
        model = CrossEncoder(str(folder), device="cpu", local_files_only=True)
    return lambda pairs: [float(s) for s in model.predict(pairs, show_progress_bar=False)]


@pytest.fixture(scope="module")
async def http(folder: Path) -> AsyncIterator[httpx.AsyncClient]:
    # A wide batch window, so concurrent requests certainly meet in one engine call.
    reranker = {"backend": "cross_encoder", "source": str(folder), "preload": True, "batch": {"window_ms": 200}}
    cli = {"enabled_models": [RERANKER, EMBED_MODEL, CHAT_MODEL], "models": {RERANKER: reranker}}
    async with serving(cli) as (app, client):
        await app.state.pool.slot(RERANKER).ensure_ready(None)
        yield client


async def rerank(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    reply = await http.post("/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCUMENTS, **body})
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


async def test_rerank_scores_equal_cross_encoder_predict_and_are_sorted(http: httpx.AsyncClient, predict) -> None:
    expected = predict([(QUERY, d) for d in DOCUMENTS])
    answer = await rerank(http)
    results = answer["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    for result in results:
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-5
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}  # by default, as Jina and vLLM
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert answer["model"] == RERANKER and answer["id"].startswith("rerank-")
    assert answer["usage"]["prompt_tokens"] > len(DOCUMENTS) * 4  # [CLS] query [SEP] doc [SEP] each


async def test_top_n_and_documents_as_strings_or_objects(http: httpx.AsyncClient, predict) -> None:
    expected = predict([(QUERY, d) for d in DOCUMENTS])
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:2]
    answer = await rerank(http, top_n=2, return_documents=False)
    assert [r["index"] for r in answer["results"]] == best
    assert all("document" not in r for r in answer["results"])
    objects = [{"text": d, "id": f"doc-{i}"} for i, d in enumerate(DOCUMENTS)]
    by_object = await rerank(http, documents=objects, return_documents=True)
    for result in by_object["results"]:
        assert result["document"] == objects[result["index"]]  # the client's own fields come back
        assert abs(result["relevance_score"] - expected[result["index"]]) < 1e-5
    for path in ("/rerank", "/v2/rerank"):
        other = await http.post(path, json={"model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 1})
        assert other.status_code == 200 and other.json()["results"][0]["index"] == best[0]


async def test_score_pairs_one_to_many_and_many_to_many(http: httpx.AsyncClient, predict) -> None:
    one_to_many = await http.post("/v1/score", json={"model": RERANKER, "text_1": QUERY, "text_2": DOCUMENTS[:3]})
    assert one_to_many.status_code == 200, one_to_many.text
    body = one_to_many.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2]
    expected = predict([(QUERY, d) for d in DOCUMENTS[:3]])
    np.testing.assert_allclose([d["score"] for d in body["data"]], expected, atol=1e-5)
    firsts = ["what is a cat", "stocks", "cake"]
    many = await http.post("/score", json={"model": RERANKER, "text_1": firsts, "text_2": DOCUMENTS[:3]})
    assert many.status_code == 200, many.text
    pairwise = predict(list(zip(firsts, DOCUMENTS[:3], strict=True)))
    np.testing.assert_allclose([d["score"] for d in many.json()["data"]], pairwise, atol=1e-5)


async def test_concurrent_requests_share_engine_calls_and_get_their_own_scores(
    http: httpx.AsyncClient, predict
) -> None:
    queries = [f"question number {i} about cats" for i in range(8)]
    before = await batches_run(http)
    replies = await asyncio.gather(*(
        http.post("/v1/score", json={"model": RERANKER, "text_1": q, "text_2": DOCUMENTS[:3]}) for q in queries
    ))  # fmt: skip
    calls = await batches_run(http) - before
    assert 1 <= calls < len(queries), calls
    for query, reply in zip(queries, replies, strict=True):
        assert reply.status_code == 200, reply.text
        expected = predict([(query, d) for d in DOCUMENTS[:3]])
        np.testing.assert_allclose([d["score"] for d in reply.json()["data"]], expected, atol=1e-5)


async def batches_run(http: httpx.AsyncClient) -> int:
    """Engine calls of the reranker's replica, read from the pool the app serves."""
    app = http._transport.app  # type: ignore[attr-defined]
    replica = app.state.pool.slot(RERANKER).replicas.members[0]
    count: int = replica.pair_batcher.batches_run
    return count


async def test_an_over_long_pair_is_cut_by_default_and_refused_when_asked(http: httpx.AsyncClient, predict) -> None:
    long_document = "purring cats " * 200  # past the model's 128 tokens
    documents = ["short", long_document]
    cut = await rerank(http, documents=documents)
    expected = predict([(QUERY, d) for d in documents])  # CrossEncoder truncates the same way
    scores = {r["index"]: r["relevance_score"] for r in cut["results"]}
    np.testing.assert_allclose([scores[0], scores[1]], expected, atol=1e-5)
    refused = await http.post(
        "/v1/rerank", json={"model": RERANKER, "query": QUERY, "documents": documents, "truncate": False}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert refused.json()["error"]["param"] == "documents[1]"


async def test_the_reranker_lists_its_task(http: httpx.AsyncClient) -> None:
    models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert models[RERANKER]["capabilities"]["tasks"] == ["rerank"]
    assert models[RERANKER]["capabilities"]["rerank"] is True
    assert models[EMBED_MODEL]["capabilities"]["rerank"] is True
    assert models[CHAT_MODEL]["capabilities"]["rerank"] is False


# ---- the embedding path, on the real MiniLM --------------------------------------------

PASSAGES = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in plants.",
    "The Python programming language uses indentation to delimit blocks of code.",
    "Mount Everest, at 8,849 metres, is the highest mountain above sea level.",
    "Insulin is a hormone that regulates the level of glucose in the blood.",
    "The French Revolution began in 1789 with the storming of the Bastille.",
]
QUERIES = {  # query → the index of the passage that answers it
    "Which landmark in Paris is made of iron?": 0,
    "How do plants make sugar from sunlight?": 1,
    "Why does whitespace matter in Python code?": 2,
    "What is the tallest mountain on Earth?": 3,
    "Which hormone controls blood sugar?": 4,
    "When did the revolution in France start?": 5,
}


@pytest.mark.parametrize(("query", "relevant"), QUERIES.items())
async def test_an_embedding_model_ranks_the_relevant_passage_first(
    http: httpx.AsyncClient, query: str, relevant: int
) -> None:
    reply = await http.post("/v1/rerank", json={"model": EMBED_MODEL, "query": query, "documents": PASSAGES})
    assert reply.status_code == 200, reply.text
    assert reply.json()["results"][0]["index"] == relevant


async def test_embedding_scores_are_the_cosine_of_the_embeddings(http: httpx.AsyncClient) -> None:
    query = next(iter(QUERIES))
    vectors = (await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": [query, *PASSAGES]})).json()
    matrix = np.array([d["embedding"] for d in vectors["data"]])
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    expected = unit[1:] @ unit[0]
    reply = await http.post("/v1/score", json={"model": EMBED_MODEL, "text_1": query, "text_2": PASSAGES})
    np.testing.assert_allclose([d["score"] for d in reply.json()["data"]], expected, atol=1e-5)
    # Each distinct text is embedded once: the query's tokens count once, not per pair.
    assert reply.json()["usage"]["prompt_tokens"] == vectors["usage"]["prompt_tokens"]


# ---- bad input --------------------------------------------------------------------------

BAD = [
    ("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": []}, "documents", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "documents": DOCUMENTS}, "query", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "query": "", "documents": DOCUMENTS}, "query", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": [{"id": 1}]}, "documents[0].text", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": [3]}, "documents[0]", "invalid_value"),
    ("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": ["a"], "rank_by": "x"}, "rank_by", "invalid_value"),
    ("/v1/rerank", {"model": CHAT_MODEL, "query": QUERY, "documents": DOCUMENTS}, "model", "unsupported_task"),
    ("/v1/score", {"model": RERANKER, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, None, "invalid_value"),
    ("/v1/score", {"model": RERANKER, "text_1": [], "text_2": "c"}, None, "invalid_value"),
    ("/v1/score", {"model": RERANKER, "text_1": "a"}, "text_2", "invalid_value"),
]


@pytest.mark.parametrize(("path", "body", "param", "code"), BAD)
async def test_bad_input_is_a_400_naming_the_field(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], param: str | None, code: str
) -> None:
    reply = await http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["message"]


async def test_an_unknown_model_is_a_404(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/rerank", json={"model": "no-such-reranker", "query": "q", "documents": ["d"]})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"


async def test_the_reranker_tokenizes_with_its_own_tokenizer(http: httpx.AsyncClient, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = "Cats purr when content."
    reply = await http.post("/tokenize", json={"model": RERANKER, "prompt": text})
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens"] == tokenizer(text)["input_ids"]  # [CLS] ... [SEP]
    assert reply.json()["max_model_len"] == 128
    back = await http.post("/detokenize", json={"model": RERANKER, "tokens": tokenizer(text)["input_ids"][1:-1]})
    assert back.json()["prompt"] == text.lower()  # an uncased WordPiece vocabulary
    chat = await http.post("/tokenize", json={"model": RERANKER, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
