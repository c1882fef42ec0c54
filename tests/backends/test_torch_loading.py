"""Models built in several threads at once leave transformers' class-level state alone.

transformers 5 swaps `PreTrainedModel.tie_weights` (and the torch init functions) for the
length of a load and puts back what it saw: two interleaved loads used to leave the
stand-in in place, so every later model with tied embeddings lost its `lm_head`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from modelpool.backends.context import BackendContext
from modelpool.backends.cross_encoder import CrossEncoderBackend, CrossEncoderOptions
from modelpool.backends.sentence_transformers import SentenceTransformersBackend, SentenceTransformersOptions
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import resolve_source
from tests.cross_encoders import MINILM, tiny_cross_encoder


def test_concurrent_model_loads_keep_weight_tying(tmp_path: Path) -> None:
    from transformers import PreTrainedModel

    original = PreTrainedModel.tie_weights
    minilm = str(resolve_source(MINILM, model_id="minilm"))
    reranker = str(tiny_cross_encoder(tmp_path / "reranker"))
    embedder = SentenceTransformersBackend(
        ModelConfig(id="e", backend="sentence_transformers", source=minilm), SentenceTransformersOptions(),
        BackendContext(),
    )  # fmt: skip
    scorer = CrossEncoderBackend(
        ModelConfig(id="r", backend="cross_encoder", source=reranker), CrossEncoderOptions(), BackendContext()
    )
    loads = [(embedder._load, minilm), (scorer._load, reranker)] * 4
    with ThreadPoolExecutor(max_workers=len(loads)) as pool:
        for loaded in pool.map(lambda job: job[0](job[1]), loads):
            assert loaded is not None
    assert PreTrainedModel.tie_weights is original
