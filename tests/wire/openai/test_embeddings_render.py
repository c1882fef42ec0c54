"""The embeddings response rendered by orjson carries the very numbers json.dumps wrote."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from modelpool.errors import GenerationFailed
from modelpool.inference import EmbeddingResult
from modelpool.wire.openai.embeddings import EmbeddingsBody, embeddings_json, embeddings_response


def result_of(vectors: np.ndarray) -> EmbeddingResult:
    return EmbeddingResult(vectors.astype(np.float32), 7 * len(vectors), tuple(7 for _ in vectors))


def body(**fields: object) -> EmbeddingsBody:
    return EmbeddingsBody.model_validate({"model": "m", "input": "a sentence", **fields})


@pytest.mark.parametrize("seed", range(5))
def test_fast_rendering_parses_to_the_same_floats_as_json_dumps(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Unit vectors like a model's, and the awkward values: tiny, huge, negative zero, subnormal.
    vectors = rng.standard_normal((4, 384)) * rng.choice([1e-30, 1e-6, 1.0, 1e6, 1e37], size=(4, 384))
    vectors[0, :4] = [0.0, -0.0, 1e-45, np.finfo(np.float32).max]
    result = result_of(vectors)
    extra = {"metrics": {"server_ms": 1.25}}
    old = json.loads(json.dumps({**embeddings_json(body(), result, "m"), **extra}))
    new = json.loads(embeddings_response(body(), result, "m", extra))
    assert new == old
    for row_new, row_old in zip(new["data"], old["data"], strict=True):  # == on floats; also the signs of zeros
        assert [np.copysign(1, x) for x in row_new["embedding"]] == [np.copysign(1, x) for x in row_old["embedding"]]


def test_the_floats_are_the_float32_values_widened_exactly() -> None:
    vectors = np.array([[0.1, 1 / 3, -2.5e-8]], dtype=np.float32)
    parsed = json.loads(embeddings_response(body(), result_of(vectors), "m", {}))["data"][0]["embedding"]
    assert parsed == [float(x) for x in vectors[0]]  # 0.10000000149011612, not float32's short "0.1"
    assert parsed[0] != 0.1


def test_base64_and_dimensions_render_as_before() -> None:
    vectors = np.random.default_rng(9).standard_normal((2, 8)).astype(np.float32)
    for fields in ({"encoding_format": "base64"}, {"dimensions": 3}, {"encoding_format": "base64", "dimensions": 3}):
        old = embeddings_json(body(**fields), result_of(vectors), "m")
        assert json.loads(embeddings_response(body(**fields), result_of(vectors), "m", {})) == old
    data = json.loads(embeddings_response(body(encoding_format="base64"), result_of(vectors), "m", {}))["data"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(data[1]["embedding"]), "<f4"), vectors[1])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_vector_with_no_json_form_is_an_error_naming_the_model(bad: float) -> None:
    """json.dumps refused NaN and infinity (a bare 500); orjson would write null instead.
    A model that returns them is broken: say so, never send nulls as an embedding."""
    vectors = np.ones((2, 4), dtype=np.float32)
    vectors[1, 2] = bad
    with pytest.raises(GenerationFailed, match=r"model 'm'.*NaN or infinite"):
        embeddings_response(body(), result_of(vectors), "m", {})
