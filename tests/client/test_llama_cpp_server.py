"""The SDK against a real third-party OpenAI-compatible server: llama-cpp-python's own
`python -m llama_cpp.server` (no /readyz, no /health, no usage in streams, its own errors)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from modelpool.client import (
    ChatMessage,
    ContextLengthExceeded,
    InvalidRequest,
    ModelsConfig,
    NotFound,
    ServerError,
    load_models_config,
    make_llm,
)
from tests.client.conftest import write_models_yaml
from tests.e2e.conftest import smollm2_gguf
from tests.processes import Server, llama_cpp_server

pytestmark = pytest.mark.e2e
ALIAS = "smollm2-peer"
HELLO = [ChatMessage.user("Name three colors.")]


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with llama_cpp_server(tmp_path_factory.mktemp("peer") / "peer.log", smollm2_gguf(), ALIAS) as server:
        yield server


@pytest.fixture(scope="module")
def config(peer: Server, tmp_path_factory: pytest.TempPathFactory) -> ModelsConfig:
    roles = {
        "generic": {"kind": "openai_compat", "base_url": f"{peer.url}/v1", "model_name": ALIAS},
        "preset": {"kind": "preset:smollm2", "base_url": peer.url, "model_name": ALIAS},  # the served name overridden
        "health_only": {"kind": "openai_compat", "base_url": peer.url, "model_name": ALIAS, "health_path": "/health"},
    }
    return load_models_config(write_models_yaml(tmp_path_factory.mktemp("peer-roles"), roles))


@pytest.mark.parametrize("role", ["generic", "preset"])
async def test_wait_ready_falls_back_to_v1_models_then_chat(config: ModelsConfig, role: str) -> None:
    async with make_llm(config, role) as llm:
        await llm.wait_ready(30)  # /readyz 404 → /health 404 → /v1/models 200
        reply = await llm.chat(HELLO, max_tokens=16, temperature=0)
    assert reply.content.strip() and reply.model == ALIAS and reply.finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.completion_tokens > 0


async def test_a_single_missing_health_path_is_not_found(config: ModelsConfig) -> None:
    async with make_llm(config, "health_only") as llm:
        with pytest.raises(NotFound) as caught:
            await llm.wait_ready(5)
    assert caught.value.status_code == 404


async def test_stream_chat_joins_to_the_greedy_answer(config: ModelsConfig) -> None:
    async with make_llm(config, "generic") as llm:
        whole = await llm.chat(HELLO, max_tokens=16, temperature=0)
        deltas = [d async for d in llm.stream_chat(HELLO, max_tokens=16, temperature=0)]
    assert "".join(d.content for d in deltas) == whole.content
    assert [d.finish_reason for d in deltas if d.finish_reason] == [whole.finish_reason]
    assert all(d.usage is None for d in deltas)  # this server ignores stream_options.include_usage


async def test_context_overflow_is_typed_from_its_envelope(config: ModelsConfig) -> None:
    async with make_llm(config, "generic") as llm:
        with pytest.raises(ContextLengthExceeded) as caught:
            await llm.chat([ChatMessage.user("word " * 3000)], max_tokens=4)
    error = caught.value
    assert isinstance(error, InvalidRequest)
    assert (error.status_code, error.code, error.param) == (400, "context_length_exceeded", "messages")


async def test_a_malformed_request_is_its_500_typed(config: ModelsConfig) -> None:
    """llama_cpp.server answers request validation errors with HTTP 500 (type
    internal_server_error): the SDK reports what the server said, typed by its status."""
    async with make_llm(config, "generic") as llm:
        with pytest.raises(ServerError) as caught:
            await llm.chat(HELLO, extra_body={"temperature": "hot"})
    assert caught.value.status_code == 500 and "temperature" in caught.value.message
    assert caught.value.error_type == "internal_server_error"
