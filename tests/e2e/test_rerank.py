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
LLAMA_SERVER_MODEL = "some-model"
"""The `model` llama-server's README example sends: named by an alias of the reranker, as a
client's fixed model name is pointed at a modelpool model."""
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
    reranker = {"backend": "cross_encoder", "source": str(folder), "preload": True, "batch": {"window_ms": 200},
                "aliases": [LLAMA_SERVER_MODEL]}  # fmt: skip
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


# llama-server's tools/server/README.md ("POST /reranking"), its example body verbatim.
README_RERANK: dict[str, Any] = {
    "model": "some-model",
    "query": "What is panda?",
    "top_n": 3,
    "documents": [
        "hi",
        "it is a bear",
        "The giant panda (Ailuropoda melanoleuca), sometimes called a panda bear or simply panda, is a bear species endemic to China.",  # noqa: E501  # verbatim
    ],
}


@pytest.mark.parametrize("path", ["/reranking", "/v1/reranking", "/rerank", "/v1/rerank"])
async def test_llama_servers_reranking_body_on_each_of_its_routes(http: httpx.AsyncClient, predict, path: str) -> None:
    reply = await http.post(path, json=README_RERANK)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == RERANKER and len(body["results"]) == 3
    expected = predict([(README_RERANK["query"], d) for d in README_RERANK["documents"]])
    for result in body["results"]:  # the fields its clients read: index and relevance_score
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)


async def test_reranking_without_model_uses_the_only_reranker(http: httpx.AsyncClient) -> None:
    """Its Options name `query` and `documents` only: a body without `model` is served."""
    bare = {"query": README_RERANK["query"], "documents": README_RERANK["documents"]}
    reply = await http.post("/reranking", json=bare)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == RERANKER and len(reply.json()["results"]) == 3


async def test_llama_servers_embedding_routes(http: httpx.AsyncClient) -> None:
    """`POST /embedding` (`content`, `embd_normalize`) and `POST /embeddings` (`/v1/embeddings`'
    options): `[{index, embedding: [[...]]}]`, one pooled vector per input, in the list of
    vectors llama-server returns for any pooling but none; no `model`: the only embedding model."""
    oai = (await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": ["hello", "a panda"]})).json()
    expected = np.array([d["embedding"] for d in oai["data"]], dtype=np.float32)
    one = await http.post("/embedding", json={"content": "hello"})
    assert one.status_code == 200, one.text
    assert [item["index"] for item in one.json()] == [0] and len(one.json()[0]["embedding"]) == 1
    np.testing.assert_allclose(one.json()[0]["embedding"][0], expected[0], atol=1e-5)
    both = (await http.post("/embeddings", json={"input": ["hello", "a panda"]})).json()
    np.testing.assert_allclose([item["embedding"][0] for item in both], expected, atol=1e-5)
    taxicab = (await http.post("/embedding", json={"content": ["a panda"], "embd_normalize": 1})).json()
    vector = np.array(taxicab[0]["embedding"][0])
    assert np.abs(vector).sum() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(vector, expected[1] / np.abs(expected[1]).sum(), atol=1e-6)
    long = await http.post("/embedding", json={"content": "panda " * 2000, "truncate": True})
    assert long.status_code == 200, long.text  # a long text is the model's to bound, not the body's
    int16 = (await http.post("/embedding", json={"content": "a panda", "embd_normalize": 0})).json()
    assert np.abs(int16[0]["embedding"][0]).max() == pytest.approx(32760, rel=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/embedding", {}, "content"),
        ("/embedding", {"content": "a", "input": "b"}, "content"),
        ("/embedding", {"content": ""}, "content"),
        ("/embedding", {"content": ["a"] * 2049}, "content"),
        ("/embedding", {"content": 5}, "content"),
        ("/embedding", {"content": "a", "embd_normalize": 65}, "embd_normalize"),
        ("/embedding", {"content": "a", "embd_normalize": -2}, "embd_normalize"),
        ("/embeddings", {"content": "a", "model": CHAT_MODEL}, "model"),
        ("/embeddings", {"content": "a", "model": "nope"}, "model"),
        ("/reranking", {"query": "q", "documents": []}, "documents"),
        ("/reranking", {"query": "q", "documents": ["d"] * 1001}, "documents"),
        ("/reranking", {"query": "q", "documents": ["d"], "top_n": -1}, "top_n"),
    ],
)
async def test_llama_server_routes_refuse_bad_bodies_in_the_envelope(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], needle: str
) -> None:
    reply = await http.post(path, json=body)
    assert reply.status_code in (400, 404), reply.text
    assert needle in reply.text and reply.json()["error"]["message"]
