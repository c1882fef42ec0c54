"""The starter chat model as shipped (the session app: the starter catalog, no overrides),
fast by default (issue 33, item 6): 16 concurrent streams all start before the first one
finishes (16 sequences, not 8 and a queue), in the KV cells 8 × 4096 had, and a prompt
near its 2048-token context still runs while one past it is a clear 400."""

from __future__ import annotations

import asyncio

import llama_cpp
import openai
import pytest
from fastapi import FastAPI

from modelpool.backends.context import BackendContext
from modelpool.backends.gpu_estimates import gguf_shape, kv_cache_bytes
from modelpool.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions
from modelpool.backends.llama_cpp.engine import LlamaEngine
from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
from tests.conftest import CHAT_MODEL
from tests.e2e.conftest import smollm2_gguf

CONTEXT = 2048  # the starter's n_ctx (starter_models.yaml)
TODAY_CELLS = 8 * 4096  # what the starter's KV cache held before: 8 sequences of 4096


def starter(app: FastAPI) -> LlamaCppBackend:
    backend = app.state.pool.slot(CHAT_MODEL).replicas.members[0].backend
    assert isinstance(backend, LlamaCppBackend)
    return backend


def engine_of(app: FastAPI) -> LlamaEngine:
    engine = starter(app)._engine
    assert engine is not None
    return engine


async def test_sixteen_streams_all_start_before_the_first_finishes(app: FastAPI) -> None:
    """Through the pool (its admission, then the engine): the in-process ASGI client would
    hand over a stream only once it had ended."""
    events: list[tuple[str, int]] = []

    async def stream(i: int) -> None:
        sampling = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
        asked = ChatRequest((ChatMessage("user", f"Tell story number {i} about the sea."),), sampling)
        started = False
        async for chunk in await app.state.pool.chat(CHAT_MODEL, asked):
            if not started and chunk.text:
                started = True
                events.append(("first token", i))
        events.append(("finished", i))

    await asyncio.gather(*(stream(i) for i in range(16)))
    first_finish = events.index(next(event for event in events if event[0] == "finished"))
    started_before = {i for kind, i in events[:first_finish] if kind == "first token"}
    # With 8 sequences the 9th to 16th waited for a whole reply to end before their first token.
    assert started_before == set(range(16)), events
    assert engine_of(app).parallel == 16


async def test_the_kv_cache_holds_no_more_than_before(app: FastAPI, oai: openai.AsyncOpenAI) -> None:
    engine, backend = engine_of(app), starter(app)
    assert (engine.n_ctx, engine.parallel) == (CONTEXT, 16)
    cells = llama_cpp.llama_n_ctx(engine.context)  # every sequence's KV cells, allocated at load
    shape = gguf_shape(smollm2_gguf())
    assert shape is not None
    assert kv_cache_bytes(shape, cells) <= kv_cache_bytes(shape, TODAY_CELLS)
    today = LlamaCppOptions(n_ctx=4096, reuse_prompt_cache=True)  # its parallel default: 8
    before = LlamaCppBackend(backend.model, today, BackendContext(hub=backend.hub))
    assert (await backend.estimate_memory()).ram_bytes <= (await before.estimate_memory()).ram_bytes
    listed = (await oai.models.retrieve(CHAT_MODEL)).model_extra
    assert listed is not None
    assert listed["capabilities"]["context_length"] == CONTEXT  # what a request may use, as documented


async def test_a_prompt_near_the_context_limit_runs_and_one_past_it_is_a_400(
    app: FastAPI, oai: openai.AsyncOpenAI
) -> None:
    token = (await starter(app).tokenize(" sea"))[-1]
    near = await oai.completions.create(model=CHAT_MODEL, prompt=[token] * (CONTEXT - 8), max_tokens=8,
                                        temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    assert near.usage is not None and (near.usage.prompt_tokens, near.usage.completion_tokens) == (CONTEXT - 8, 8)
    with pytest.raises(openai.BadRequestError) as past:
        await oai.completions.create(model=CHAT_MODEL, prompt=[token] * (CONTEXT - 7), max_tokens=8)
    assert f"limit of {CONTEXT} tokens" in str(past.value)
    with pytest.raises(openai.BadRequestError) as whole:
        await oai.completions.create(model=CHAT_MODEL, prompt=[token] * CONTEXT, max_tokens=1)
    assert f"at most {CONTEXT}" in str(whole.value)
