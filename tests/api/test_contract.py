"""The declared backend contract, end to end through the app: a backend found by import path,
capabilities shown to clients, a broken backend refused at load with what it lacks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from modelpool.backends.base import contract_problem
from modelpool.backends.registry import backend_class, model_capabilities
from modelpool.capabilities import Locality
from modelpool.config import load_config
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError
from modelpool.runtime.build import build_pool
from modelpool.server.app import create_app
from modelpool.tasks import Task
from tests.audio_files import wav_bytes
from tests.fakes import EchoBackend

MODELS = {
    "echo": {"backend": "tests.fakes:EchoBackend", "options": {"prefix": "echo:"}, "preload": False},
    "broken": {"backend": "tests.fakes:BrokenEchoBackend", "preload": False, "tasks": ["chat", "embedding"]},
    "counter": {"backend": "tests.fakes:SampleCountingTranscriber", "preload": False},
}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = load_config(environ={}, cli={"starter_models": False, "models": MODELS})
    app = create_app(config, build_pool(config))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http


def test_a_backend_by_import_path_is_resolved_by_the_one_rule() -> None:
    model = ModelConfig(id="echo", backend="tests.fakes:EchoBackend")
    assert backend_class(model.backend) is EchoBackend
    capabilities = model_capabilities(model)
    assert capabilities.tasks == frozenset({Task.CHAT}) and capabilities.overridable == frozenset({"prefix"})
    with pytest.raises(ConfigError, match="cannot do embedding"):
        model_capabilities(ModelConfig(id="echo", backend="tests.fakes:EchoBackend", tasks=[Task.EMBEDDING]))
    with pytest.raises(ConfigError, match="cannot be imported"):
        backend_class("tests.fakes:NoSuchBackend")


def test_contract_problem_names_the_task_and_the_missing_members() -> None:
    echo = EchoBackend(ModelConfig(id="echo", backend="x"), EchoBackend.Options(), context=None)  # type: ignore[arg-type]
    assert contract_problem(echo, frozenset({Task.CHAT}), Locality.IN_PROCESS) is None
    problem = contract_problem(echo, frozenset({Task.CHAT, Task.EMBEDDING}), Locality.IN_PROCESS)
    assert problem == "task 'embedding' needs EmbeddingBackend, and it lacks embed"
    process = contract_problem(echo, frozenset({Task.CHAT}), Locality.ENGINE_PROCESS)
    assert process is not None and "ProcessBackend" in process and "log_tail" in process


async def test_capabilities_are_listed_for_clients_and_admins(client: httpx.AsyncClient) -> None:
    listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    capabilities: dict[str, Any] = listed["echo"]["capabilities"]
    assert capabilities["tasks"] == ["chat"] and capabilities["modalities"] == ["text"]
    assert capabilities["multi_turn"] is True and capabilities["thinking_modes"] == []
    assert (capabilities["tools"], capabilities["structured_output"]) == (False, False)
    assert capabilities["locality"] == "in_process" and capabilities["needs_source"] is False
    assert listed["broken"]["capabilities"]["tasks"] == ["chat", "embedding"]
    admin = {m["id"]: m for m in (await client.get("/v1/admin/models")).json()["data"]}
    assert admin["echo"]["capabilities"] == capabilities and admin["echo"]["overridable"] == ["prefix"]
    gpus = (await client.get("/v1/admin/gpu-memory")).json()
    memory = (await client.get("/v1/admin/memory")).json()
    assert gpus["gpus"] == memory["gpus"] and gpus["available"] is bool(memory["gpus"])


async def test_the_smallest_backend_serves_chat(client: httpx.AsyncClient) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hello there"}]}
    reply = (await client.post("/v1/chat/completions", json=body)).json()
    assert reply["choices"][0]["message"]["content"] == "echo:hello there "


async def test_tools_and_formats_reach_only_backends_that_declare_them(client: httpx.AsyncClient) -> None:
    """The echo backend declares neither: asked for them, it is a 400 naming the field, not
    an answer that silently ignores them. `tool_choice: none` asks for no calls."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    hi = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": [tool]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
         "response_format"),
    ]  # fmt: skip
    for fields, param in cases:
        response = await client.post("/v1/chat/completions", json={"model": "echo", "messages": hi, **fields})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert "does not support" in response.json()["error"]["message"]
    unused = await client.post("/v1/chat/completions", json={"model": "echo", "messages": hi, "tools": [tool],
                                                             "tool_choice": "none"})  # fmt: skip
    assert unused.status_code == 200 and unused.json()["choices"][0]["message"]["content"] == "echo:hi "
    responses = await client.post("/v1/responses", json={"model": "echo", "input": "hi",
                                                          "text": {"format": {"type": "json_object"}}})  # fmt: skip
    assert responses.status_code == 400 and responses.json()["error"]["param"] == "response_format"


async def test_a_backend_that_breaks_its_contract_fails_the_load_with_what_it_lacks(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "broken", "messages": [{"role": "user", "content": "hi"}]}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "model_load_error"
    assert "'broken'" in error["message"] and "task 'embedding'" in error["message"]
    assert "lacks embed" in error["message"]
    model = (await client.get("/v1/models/broken")).json()
    assert model["state"] == "failed" and "lacks embed" in model["error"]


async def test_listing_voices_reads_the_files_and_loads_nothing() -> None:
    config = load_config(environ={}, cli={"enabled_models": ["piper-en-us-joe", "smollm2-135m-instruct"]})
    pool = build_pool(config)
    voices = await pool.voices()
    assert [(v.model, v.voice.language, v.voice.sample_rate) for v in voices] == [("piper-en-us-joe", "en_US", 22050)]
    assert {s.state for s in pool.statuses()} == {"unloaded"}  # neither the voice nor another model was loaded


async def test_uploads_are_decoded_at_the_rate_the_backend_declares(client: httpx.AsyncClient) -> None:
    second_at_44k = wav_bytes(rate=44_100, sample=b"\x00\x10")
    files = {"file": ("one-second.wav", second_at_44k, "audio/wav")}
    form = {"model": "counter", "response_format": "verbose_json"}
    reply = (await client.post("/v1/audio/transcriptions", data=form, files=files)).json()
    assert reply["text"] == "8000" and reply["duration"] == pytest.approx(1.0)
