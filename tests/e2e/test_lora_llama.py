"""LoRA adapters on the in-process llama.cpp engine, on the real SmolLM2 GGUF with two small
adapters built by the tests (tests/lora_models.py): an adapter's prompt logprobs and greedy
text equal llama.cpp's own adapter path (`llama_cpp.Llama(lora_path=...)`) and differ from
the base model's; two adapters and the base model decoding in one engine step each equal
their solo output; an unknown adapter is a 400 naming it; a model holds at most
`max_adapters`, the least recently used idle one unloaded; the prompt cache never reuses KV
cells computed under another adapter; adapters count in the model's memory estimate; a preloaded
adapter at scale 0.5 equals `Llama(lora_scale=0.5)`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from fastapi import FastAPI

from modelpool.backends.context import BackendContext
from modelpool.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions
from modelpool.client import AdminClient
from modelpool.client import InvalidRequest as ClientInvalidRequest
from modelpool.client import ModelNotFound as ClientModelNotFound
from modelpool.config.schema import ModelConfig
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.e2e.test_messages import claude_on
from tests.live_server import live_server
from tests.lora_models import lora_gguf

MODEL, LRU_MODEL = "lora-chat", "lora-lru"
OPTIONS = {"n_ctx": 512, "parallel": 4}
PROMPT = "The capital of France is"
HALF = 0.5
"""The LRU model's poet adapter runs at this scale (and is preloaded)."""


def entry(max_adapters: int, **options: Any) -> dict[str, Any]:
    adapters = {"pirate": str(lora_gguf("pirate")), "poet": {"source": str(lora_gguf("poet")), "scale": 1.0}}
    return {"backend": "llama_cpp", "source": str(smollm2_gguf()), "tasks": ["chat", "completion"],
            "options": {**OPTIONS, **options}, "adapters": adapters, "max_adapters": max_adapters}  # fmt: skip


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    half_poet = {"source": str(lora_gguf("poet")), "scale": HALF, "preload": True}
    lru = {**entry(1, reuse_prompt_cache=True), "adapters": {"pirate": str(lora_gguf("pirate")), "poet": half_poet}}
    models = {MODEL: entry(2), LRU_MODEL: lru}
    async with serving({"enabled_models": list(models), "models": models}) as (app, client):
        for model in models:
            await app.state.pool.slot(model).ensure_ready(None)
        yield app, client


def engine_of(app: FastAPI, model: str) -> Any:
    return app.state.pool.slot(model).replicas.members[0].backend._engine


def reference_llama(lora: str | None, scale: float = 1.0) -> Any:
    """llama.cpp's own path, with the kernels the engine runs (as tests/e2e/conftest.py's `reference`)."""
    from llama_cpp import Llama

    return Llama(str(smollm2_gguf()), lora_path=lora, lora_scale=scale, logits_all=True, n_ctx=512, n_ubatch=63,
                 flash_attn=True, verbose=False)  # fmt: skip


def reference_logprobs(llm: Any, tokens: list[int]) -> list[float]:
    llm.reset()
    llm.eval(tokens)
    scores = llm.scores[: len(tokens)].astype(np.float64)
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return [float(log_softmax[i - 1][tokens[i]]) for i in range(1, len(tokens))]


async def complete(client: openai.AsyncOpenAI, model: str, **extra: Any) -> openai.types.Completion:
    body: dict[str, Any] = {"max_tokens": 16, "temperature": 0, **extra}
    return await client.completions.create(model=model, prompt=PROMPT, **body)


async def test_adapter_logprobs_and_text_equal_llama_cpps_own_adapter_path(served) -> None:
    _, http = served
    client = sdk(http)
    scored = await complete(client, f"{MODEL}:pirate", echo=True, logprobs=0, max_tokens=1)
    assert scored.choices[0].logprobs is not None
    served_logprobs = [lp for lp in scored.choices[0].logprobs.token_logprobs or [] if lp is not None]
    llm = reference_llama(str(lora_gguf("pirate")))
    tokens = llm.tokenize(PROMPT.encode(), add_bos=False)
    expected = reference_logprobs(llm, tokens)
    assert np.allclose(served_logprobs[: len(expected)], expected, atol=2e-3)
    base = reference_logprobs(reference_llama(None), tokens)
    assert not np.allclose(base, expected, atol=2e-3)  # the adapter changes the logits

    text = (await complete(client, f"{MODEL}:pirate")).choices[0].text
    llm.reset()
    own = llm.create_completion(PROMPT, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    assert text == own
    same = (await complete(client, MODEL, extra_body={"adapter": "pirate"})).choices[0].text
    assert same == text  # the explicit field says what `model: base:adapter` says
    assert (await complete(client, MODEL)).choices[0].text != text


async def test_two_adapters_and_the_base_in_one_batch_equal_their_solo_output(served) -> None:
    app, http = served
    client = sdk(http)

    async def chat(model: str) -> str:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me about the sea."}], max_tokens=24, temperature=0
        )
        return reply.choices[0].message.content or ""

    names = [f"{MODEL}:pirate", f"{MODEL}:poet", MODEL]
    solo = [await chat(name) for name in names]
    assert len(set(solo)) == 3  # each adapter answers differently
    engine = engine_of(app, MODEL)
    engine.largest_batch = 0
    together = await asyncio.gather(*(chat(name) for name in names))
    assert list(together) == solo
    assert engine.largest_batch == 3  # all three decoded in the same steps (one llama_decode per adapter)


async def test_an_unknown_adapter_is_a_400_naming_it(served) -> None:
    _, http = served
    client = sdk(http)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=f"{MODEL}:nope", messages=messages, max_tokens=2)
    assert "'nope'" in caught.value.message and caught.value.code == "adapter_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"adapter": "nope"})
    assert "'nope'" in caught.value.message
    with pytest.raises(openai.BadRequestError):  # a name, never a path
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"adapter": "../x.gguf"})
    with pytest.raises(openai.BadRequestError) as caught:  # the two ways disagree
        await client.completions.create(model=f"{MODEL}:pirate", prompt="hi", max_tokens=2,
                                        extra_body={"adapter": "poet"})  # fmt: skip
    assert "poet" in caught.value.message
    with pytest.raises(openai.NotFoundError):  # no such base model
        await client.completions.create(model="no-such-model:pirate", prompt="hi", max_tokens=2)


async def test_a_preloaded_adapter_at_half_scale_equals_llamas_lora_scale(served) -> None:
    """`preload: true` loads the adapter with its model; `scale: 0.5` equals
    `Llama(lora_scale=0.5)` and differs from scale 1."""
    app, http = served
    assert [a.spec.name for a in engine_of(app, LRU_MODEL).adapters.loaded] == ["poet"]  # before any request
    # Its own prompt: the LRU test below counts prompt-cache reuse of PROMPT under poet.
    prompt = "Once upon a time"
    body: dict[str, Any] = {"echo": True, "logprobs": 0, "max_tokens": 1, "temperature": 0}
    scored = await sdk(http).completions.create(model=f"{LRU_MODEL}:poet", prompt=prompt, **body)
    assert scored.choices[0].logprobs is not None
    served_logprobs = [lp for lp in scored.choices[0].logprobs.token_logprobs or [] if lp is not None]
    llm = reference_llama(str(lora_gguf("poet")), HALF)
    tokens = llm.tokenize(prompt.encode(), add_bos=False)
    expected = reference_logprobs(llm, tokens)
    assert np.allclose(served_logprobs[: len(expected)], expected, atol=2e-3)
    full = reference_logprobs(reference_llama(str(lora_gguf("poet"))), tokens)
    assert not np.allclose(expected, full, atol=1e-2)


async def test_least_recently_used_adapter_is_unloaded_and_no_kv_is_reused_across_adapters(served) -> None:
    app, http = served
    client = sdk(http)
    base_alone = (await complete(client, LRU_MODEL)).choices[0].text
    engine = engine_of(app, LRU_MODEL)
    pirate = (await complete(client, f"{LRU_MODEL}:pirate")).choices[0].text
    assert [a.spec.name for a in engine.adapters.loaded] == ["pirate"]
    reused, evictions = engine.reused_tokens, engine.adapters.evictions
    poet = (await complete(client, f"{LRU_MODEL}:poet")).choices[0].text
    assert [a.spec.name for a in engine.adapters.loaded] == ["poet"] and engine.adapters.evictions == evictions + 1
    assert engine.reused_tokens == reused  # the same prompt is cached, but under the base model and another adapter
    assert (await complete(client, f"{LRU_MODEL}:poet")).choices[0].text == poet
    assert engine.reused_tokens > reused  # under the same adapter its cells serve again
    assert (await complete(client, LRU_MODEL)).choices[0].text == base_alone
    assert len({base_alone, pirate, poet}) == 3


async def test_adapters_count_in_the_models_memory_estimate() -> None:
    config = entry(2)
    with_adapters = ModelConfig(id="m", **config)
    without = ModelConfig(id="m", **{**config, "adapters": {}})
    options = LlamaCppOptions.model_validate(config["options"])
    sizes = lora_gguf("pirate").stat().st_size + lora_gguf("poet").stat().st_size
    backends = [LlamaCppBackend(m, options, BackendContext()) for m in (with_adapters, without)]
    estimates = [await backend.estimate_memory() for backend in backends]
    assert estimates[0].ram_bytes - estimates[1].ram_bytes == sizes


async def test_models_list_each_adapter_with_its_base_as_parent(served) -> None:
    _, http = served
    listed = {model.id: model for model in [m async for m in sdk(http).models.list()]}
    pirate = listed[f"{MODEL}:pirate"].model_dump()
    assert pirate["parent"] == MODEL and pirate["adapter"] == "pirate" and pirate["capabilities"]["adapters"]
    assert {f"{LRU_MODEL}:pirate", f"{LRU_MODEL}:poet", MODEL} <= set(listed)
    assert "parent" not in listed[MODEL].model_dump()


async def test_admin_loads_and_unloads_declared_adapters_through_the_sdk(served) -> None:
    app, _ = served
    async with live_server(app, lifespan=False) as url:
        with AdminClient(url) as admin:
            shown = await asyncio.to_thread(admin.load_adapter, MODEL, "poet")
            assert shown["adapters"] == ["pirate", "poet"] and shown["adapters_loaded"][-1] == "poet"
            shown = await asyncio.to_thread(admin.unload_adapter, MODEL, "poet")
            assert "poet" not in shown["adapters_loaded"]
            assert "poet" not in [a.spec.name for a in engine_of(app, MODEL).adapters.loaded]
            with pytest.raises(ClientInvalidRequest) as caught:  # only a declared adapter, by name
                await asyncio.to_thread(admin.load_adapter, MODEL, "nope")
            assert caught.value.code == "adapter_not_found" and "'nope'" in str(caught.value)
            with pytest.raises(ClientInvalidRequest):  # a name, never a path
                await asyncio.to_thread(admin.load_adapter, MODEL, "bad:name")
            with pytest.raises(ClientModelNotFound):  # a slash makes it another (unknown) model's route
                await asyncio.to_thread(admin.load_adapter, MODEL, "..%2Fx.gguf")
            shown = await asyncio.to_thread(admin.load_adapter, MODEL, "poet")
            assert "poet" in shown["adapters_loaded"]
            held = sum(lora_gguf(name).stat().st_size for name in shown["adapters_loaded"])
            memory = await asyncio.to_thread(admin.memory)
            assert memory["models"][MODEL]["adapters_bytes"] == held > 0  # the admin memory report counts them


async def test_responses_and_anthropic_messages_take_base_colon_adapter(served) -> None:
    app, http = served
    question = "Tell me about the sea."
    body: dict[str, Any] = {"max_tokens": 12, "temperature": 0}
    chat = await sdk(http).chat.completions.create(
        model=f"{MODEL}:poet", messages=[{"role": "user", "content": question}], **body
    )
    expected = chat.choices[0].message.content
    reply = await sdk(http).responses.create(model=f"{MODEL}:poet", input=question, max_output_tokens=12, temperature=0)
    assert reply.output_text == expected
    async with claude_on(app) as claude:
        message = await claude.messages.create(
            model=f"{MODEL}:poet", messages=[{"role": "user", "content": question}], max_tokens=12,
            extra_body={"temperature": 0},  # this SDK no longer has the argument
        )
        assert message.content[0].type == "text" and message.content[0].text == expected
        with pytest.raises(anthropic.BadRequestError) as caught:  # in Anthropic's own error envelope
            await claude.messages.create(model=f"{MODEL}:nope", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2)  # fmt: skip
        assert "'nope'" in caught.value.message


async def test_generate_takes_the_adapter_and_refuses_an_unknown_one(served) -> None:
    _, http = served
    body = {"prompts": [PROMPT], "max_tokens": 16, "temperature": 0}
    pirate = (await complete(sdk(http), f"{MODEL}:pirate")).choices[0].text
    for extra in ({"model": f"{MODEL}:pirate"}, {"model": MODEL, "adapter": "pirate"}):
        reply = await http.post("/generate", json={**body, **extra})
        assert reply.status_code == 200 and reply.json()["completions"] == [pirate]
    refused = await http.post("/generate", json={**body, "model": f"{MODEL}:nope"})
    assert refused.status_code == 400 and "'nope'" in refused.json()["error"]["message"]
