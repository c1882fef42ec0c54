"""`thinking_modes` and `thinking_default` as /v1/models lists them: engines that split the
reasoning themselves and get `thinking` through their chat template (vLLM, llama-server, an
upstream) offer all three modes without a `reasoning_parser` here (issue 31: llm-pool's
clients read `thinking_modes` to decide whether to send `thinking`); the per-model
`enable_thinking` default is validated and shown."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from modelpool.backends.registry import model_capabilities
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError

ALL_MODES = ["default", "enabled", "disabled"]
GGUF = "/models/smollm2.Q4_1.gguf"  # never opened: capabilities come from the config alone
NATIVE = {"binary": "/opt/llama.cpp/llama-server"}  # never run either


def listed(**config: Any) -> dict[str, Any]:
    return model_capabilities(ModelConfig(id="m", **config)).as_json()


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "vllm_serve", "source": GGUF},
        {"backend": "llama_server", "source": GGUF, "options": NATIVE},
        {"backend": "openai_remote", "options": {"base_url": "https://upstream.example/v1"}},
        {"backend": "llama_cpp", "source": GGUF, "reasoning_parser": "think"},
    ],
    ids=["vllm_serve", "llama_server", "openai_remote", "llama_cpp-with-parser"],
)
def test_engines_that_split_reasoning_offer_every_thinking_mode(config: dict[str, Any]) -> None:
    assert listed(**config)["thinking_modes"] == ALL_MODES


def test_an_in_process_engine_without_a_reasoning_parser_offers_none() -> None:
    assert listed(backend="llama_cpp", source=GGUF)["thinking_modes"] == []


@pytest.mark.parametrize(
    "options",
    [{}, {**NATIVE, "jinja": False}],
    ids=["llama_cpp.server", "llama-server-without-jinja"],
)
def test_a_llama_server_that_neither_renders_kwargs_nor_splits_reasoning_offers_none(options: dict[str, Any]) -> None:
    """llama-cpp-python's server (the default, no `binary`) ignores `chat_template_kwargs` and
    returns the reasoning in the text; llama-server without `--jinja` does not render them."""
    assert listed(backend="llama_server", source=GGUF, options=options)["thinking_modes"] == []


def test_a_managed_engine_that_does_not_chat_offers_none() -> None:
    options = {**NATIVE, "embedding": True}
    capabilities = listed(backend="llama_server", source=GGUF, tasks=["embedding"], options=options)
    assert capabilities["thinking_modes"] == []


@pytest.mark.parametrize("default", [True, False, None])
def test_the_enable_thinking_default_is_shown(default: bool | None) -> None:
    assert listed(backend="vllm_serve", source=GGUF, enable_thinking=default)["thinking_default"] is default


def test_enable_thinking_is_a_boolean_and_for_chat_models_only() -> None:
    with pytest.raises(ValidationError, match="enable_thinking"):
        ModelConfig(id="m", backend="llama_cpp", source=GGUF, enable_thinking="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="enable_thinking is set, but the model does not chat"):
        listed(backend="sentence_transformers", source="/models/e5", enable_thinking=False)
