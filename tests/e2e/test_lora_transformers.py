"""LoRA adapters on the transformers engine (PEFT), on the real SmolLM2-135M (float32) with
two small adapters built by the tests (tests/lora_models.py, their PEFT form): an adapter's
prompt logprobs and greedy text equal PEFT's own `PeftModel` on the same weights and differ
from the base model's; two adapters and the base model decoding in one forward each equal
their solo output; an unknown adapter is a 400 naming it; a model holds at most
`max_adapters`, the least recently used idle one unloaded; the admin API loads and unloads
them and reports their memory; adapters count in the model's memory estimate; a preloaded adapter
at scale 0.5 equals PEFT's set_scale(0.5); a broken adapter fails alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import cache
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI

from modelpool.backends.context import BackendContext
from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.backends.transformers.backend import TransformersBackend, TransformersOptions
from modelpool.client import AdminClient
from modelpool.client import InvalidRequest as ClientInvalidRequest
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.quiet_warnings import ignoring
from tests.conftest import sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.live_server import live_server
from tests.lora_models import broken_peft_folder, peft_folder
from tests.polling import until

MODEL, LRU_MODEL, BROKEN_MODEL = "lora-hf", "lora-hf-lru", "lora-hf-broken"
PROMPT = "The capital of France is"
HALF = 0.5
"""The LRU model's poet adapter runs at this scale (and is preloaded)."""
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
"""PEFT's own model (the reference) asks transformers 5 a deprecated question on wrapping."""


def entry(max_adapters: int) -> dict[str, Any]:
    adapters = {"pirate": str(peft_folder("pirate")), "poet": {"source": str(peft_folder("poet")), "scale": 1.0}}
    return {"backend": "transformers", "source": str(smollm2_gguf()), "tasks": ["chat", "completion"],
            "options": {"max_batch_size": 4}, "adapters": adapters, "max_adapters": max_adapters}  # fmt: skip


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    broken = {**entry(2), "adapters": {"broken": str(broken_peft_folder()), "poet": str(peft_folder("poet"))}}
    half_poet = {"source": str(peft_folder("poet")), "scale": HALF, "preload": True}
    lru = {**entry(1), "adapters": {"pirate": str(peft_folder("pirate")), "poet": half_poet}}
    models = {MODEL: entry(2), LRU_MODEL: lru, BROKEN_MODEL: broken}
    async with serving({"enabled_models": list(models), "models": models}) as (app, client):
        for model in models:
            await app.state.pool.slot(model).ensure_ready(None)
        yield app, client


def engine_of(app: FastAPI, model: str) -> Any:
    return app.state.pool.slot(model).replicas.members[0].backend._engine


@cache
def reference(adapter: str | None, scale: float = 1.0) -> tuple[Any, Any]:
    """PEFT's own path: the same float32 weights, the adapter through `PeftModel` at `scale`
    (PEFT's `set_scale` on every LoRA layer) (tokenizer, model)."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = hf_folder_for(smollm2_gguf(), HubLocation.work_dir)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if adapter is not None:
        with ignoring(FutureWarning, "`is_gradient_checkpointing` is deprecated"):  # as the engine's load does
            model = PeftModel.from_pretrained(model, str(peft_folder(adapter))).eval()
        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.set_scale("default", scale)
    return AutoTokenizer.from_pretrained(folder), model


def reference_run(adapter: str | None, max_tokens: int, scale: float = 1.0) -> tuple[list[float], str]:
    """The prompt's logprobs and the greedy continuation, by PEFT's model."""
    import torch

    tokenizer, model = reference(adapter, scale)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             do_sample=False)  # fmt: skip
    scored = [float(logprobs[i - 1, ids[0, i]]) for i in range(1, ids.shape[1])]
    return scored, tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


async def complete(client: openai.AsyncOpenAI, model: str, **extra: Any) -> openai.types.Completion:
    body: dict[str, Any] = {"max_tokens": 12, "temperature": 0, **extra}
    return await client.completions.create(model=model, prompt=PROMPT, **body)


async def test_adapter_logprobs_and_text_equal_pefts_own_model(served) -> None:
    _, http = served
    client = sdk(http)
    texts = {}
    for adapter in (None, "pirate", "poet"):
        model = MODEL if adapter is None else f"{MODEL}:{adapter}"
        served_run = await complete(client, model, echo=True, logprobs=1, max_tokens=12)
        choice = served_run.choices[0]
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        prompt_count = served_run.usage.prompt_tokens if served_run.usage else 0
        prompt_logprobs = choice.logprobs.token_logprobs[1:prompt_count]
        want_logprobs, want_text = await asyncio.to_thread(reference_run, adapter, 12)
        assert prompt_logprobs == pytest.approx(want_logprobs, abs=2e-3)
        text = (await complete(client, model)).choices[0].text
        assert text == want_text
        texts[adapter] = (text, prompt_logprobs)
    assert len({text for text, _ in texts.values()}) == 3  # each adapter changes the greedy text
    attention = engine_of(served[0], MODEL).model.model.layers[0].self_attn
    kinds = {name: type(getattr(attention, name)).__name__ for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    # PEFT wraps the adapters' targets; the other linears stay packed for oneDNN
    assert kinds == {"q_proj": "Linear", "k_proj": "PackedLinear", "v_proj": "Linear", "o_proj": "PackedLinear"}
    assert type(attention.q_proj).__module__.startswith("peft.")
    assert texts["pirate"][1] != pytest.approx(texts[None][1], abs=1e-2)


async def test_two_adapters_and_the_base_in_one_forward_equal_their_solo_output(served) -> None:
    app, http = served
    client = sdk(http)
    models = [MODEL, f"{MODEL}:pirate", f"{MODEL}:poet"]

    async def chat(model: str) -> str:
        messages: list[Any] = [{"role": "user", "content": "Tell me a story."}]
        reply = await client.chat.completions.create(model=model, max_tokens=16, temperature=0, messages=messages)
        return reply.choices[0].message.content or ""

    alone = [await chat(model) for model in models]
    engine = engine_of(app, MODEL)
    largest = engine.largest_batch
    engine.largest_batch = 0
    together = await asyncio.gather(*(chat(model) for model in models))
    assert engine.largest_batch == 3, "the three requests never decoded in one forward"
    engine.largest_batch = max(largest, engine.largest_batch)
    assert list(together) == alone and len(set(alone)) == 3


async def test_a_broken_adapter_fails_its_requests_and_leaves_the_base_and_others_intact(served) -> None:
    """PEFT injects an adapter's LoRA layers before it loads their weights: a load that fails
    half done must take them out again, first adapter (the model unwrapped) or a later one."""
    _, http = served
    client = sdk(http)
    (_, want_base), (_, want_poet) = await asyncio.gather(
        asyncio.to_thread(reference_run, None, 12), asyncio.to_thread(reference_run, "poet", 12)
    )

    async def broken_fails() -> None:
        with pytest.raises(openai.APIStatusError) as caught:
            await complete(client, f"{BROKEN_MODEL}:broken", max_tokens=2)
        assert caught.value.status_code == 503 and "adapter 'broken'" in caught.value.message
        assert "size mismatch" in caught.value.message

    await broken_fails()  # the model's first adapter load
    assert (await complete(client, BROKEN_MODEL)).choices[0].text == want_base
    assert (await complete(client, f"{BROKEN_MODEL}:poet")).choices[0].text == want_poet
    await broken_fails()  # a later one, beside a loaded adapter
    assert (await complete(client, BROKEN_MODEL)).choices[0].text == want_base
    assert (await complete(client, f"{BROKEN_MODEL}:poet")).choices[0].text == want_poet


async def test_an_unknown_adapter_is_a_400_naming_it(served) -> None:
    _, http = served
    client = sdk(http)
    for extra in ({"model": f"{MODEL}:nope"}, {"model": MODEL, "extra_body": {"adapter": "nope"}}):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(prompt=PROMPT, max_tokens=2, **extra)
        assert caught.value.status_code == 400 and "'nope'" in caught.value.message
        assert caught.value.code == "adapter_not_found"


async def test_a_preloaded_adapter_at_half_scale_equals_pefts_set_scale(served) -> None:
    """`preload: true` loads the adapter with its model; `scale: 0.5` runs it as PEFT's
    `set_scale(0.5)` does, not as scale 1 (the other model's poet)."""
    app, http = served
    client = sdk(http)
    assert engine_of(app, LRU_MODEL).adapters.loaded == ["poet"]  # before any request named it
    run = await complete(client, f"{LRU_MODEL}:poet", echo=True, logprobs=1, max_tokens=12)
    choice = run.choices[0]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    prompt_count = run.usage.prompt_tokens if run.usage else 0
    want_logprobs, want_text = await asyncio.to_thread(reference_run, "poet", 12, HALF)
    assert choice.logprobs.token_logprobs[1:prompt_count] == pytest.approx(want_logprobs, abs=2e-3)
    assert (await complete(client, f"{LRU_MODEL}:poet")).choices[0].text == want_text
    full_logprobs, _ = await asyncio.to_thread(reference_run, "poet", 12)
    assert want_logprobs != pytest.approx(full_logprobs, abs=1e-2)


async def test_least_recently_used_adapter_is_unloaded(served) -> None:
    app, http = served
    client = sdk(http)
    engine = engine_of(app, LRU_MODEL)
    pirate = (await complete(client, f"{LRU_MODEL}:pirate")).choices[0].text
    assert engine.adapters.loaded == ["pirate"]
    evictions = engine.adapters.evictions
    poet = (await complete(client, f"{LRU_MODEL}:poet")).choices[0].text
    assert engine.adapters.loaded == ["poet"] and engine.adapters.evictions == evictions + 1
    assert (await complete(client, f"{LRU_MODEL}:pirate")).choices[0].text == pirate  # reloaded, same output
    assert pirate != poet
    held = app.state.pool.slot(LRU_MODEL).replicas.members[0].backend.loaded_adapters()
    assert held == ["pirate"] and engine.adapters.total_bytes() > 0


async def test_a_request_for_another_adapter_waits_while_all_places_are_in_use(served) -> None:
    app, http = served
    client = sdk(http)
    solo = {name: (await complete(client, f"{LRU_MODEL}:{name}", max_tokens=24)).choices[0].text
            for name in ("pirate", "poet")}  # fmt: skip
    engine = engine_of(app, LRU_MODEL)
    evictions = engine.adapters.evictions
    # max_adapters 1: the second waits until the first's sequence ends, then its adapter swaps in
    both = await asyncio.gather(*(complete(client, f"{LRU_MODEL}:{name}", max_tokens=24) for name in solo))
    assert [reply.choices[0].text for reply in both] == list(solo.values())
    assert engine.adapters.evictions >= evictions + 1


async def test_a_scoring_for_another_adapter_waits_while_all_places_are_in_use(served) -> None:
    """A prompt's scoring (`echo` + `logprobs`) runs outside the batch; with its adapter's
    only place held by a running request it waits its turn too (it was a 429)."""
    app, http = served
    client = sdk(http)
    engine = engine_of(app, LRU_MODEL)
    solo = await complete(client, f"{LRU_MODEL}:poet", echo=True, logprobs=1, max_tokens=1)
    running = asyncio.create_task(complete(client, f"{LRU_MODEL}:pirate", max_tokens=96))
    await until(lambda: engine.adapters_in_use() == {"pirate"}, "pirate holding the only adapter place")
    scored = await complete(client, f"{LRU_MODEL}:poet", echo=True, logprobs=1, max_tokens=1)
    assert scored.choices[0].logprobs == solo.choices[0].logprobs
    await running


async def test_adapters_count_in_the_models_memory_estimate() -> None:
    config = entry(2)
    with_adapters = ModelConfig(id="m", **config)
    without = ModelConfig(id="m", **{**config, "adapters": {}})
    options = TransformersOptions.model_validate(config["options"])
    sizes = sum((peft_folder(name) / "adapter_model.safetensors").stat().st_size for name in ("pirate", "poet"))
    backends = [TransformersBackend(m, options, BackendContext()) for m in (with_adapters, without)]
    estimates = [await backend.estimate_memory() for backend in backends]
    assert estimates[0].ram_bytes - estimates[1].ram_bytes == sizes


async def test_admin_loads_and_unloads_adapters_and_reports_their_memory(served) -> None:
    app, _ = served
    engine = engine_of(app, MODEL)
    async with live_server(app, lifespan=False) as url:
        with AdminClient(url) as admin:
            shown = await asyncio.to_thread(admin.load_adapter, MODEL, "poet")
            assert shown["adapters_loaded"][-1] == "poet" and engine.adapters.loaded[-1] == "poet"
            memory = await asyncio.to_thread(admin.memory)
            assert memory["models"][MODEL]["adapters_bytes"] == engine.adapters.total_bytes() > 0
            shown = await asyncio.to_thread(admin.unload_adapter, MODEL, "poet")
            assert "poet" not in shown["adapters_loaded"] and "poet" not in engine.adapters.loaded
            with pytest.raises(ClientInvalidRequest) as caught:
                await asyncio.to_thread(admin.load_adapter, MODEL, "nope")
            assert caught.value.code == "adapter_not_found"
    # unloaded, it still serves the next request that names it (loaded again on demand)
    assert (await complete(sdk(served[1]), f"{MODEL}:poet")).choices[0].text == reference_run("poet", 12)[1]
