"""A greedy request's tokens are the argmax the engine takes itself (engine.py `_choose`),
the very tokens llama.cpp's greedy sampler chain picks, on the real SmolLM2 GGUF: alone,
four at once, and under a grammar that masks the logits first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from modelpool.backends.context import BackendContext
from modelpool.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions
from modelpool.backends.llama_cpp.sequence import Job
from modelpool.config.schema import ModelConfig
from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
from modelpool.pool_api.generation import collect
from modelpool.tasks import Task
from tests.hub_repos import smollm2_gguf

QUESTIONS = ("What is the capital of France?", "Name three colours.", "Count from one to ten.", "Why is the sky blue?")
DIGITS = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture
async def backend() -> AsyncIterator[LlamaCppBackend]:
    pytest.importorskip("llama_cpp")
    config = ModelConfig(id="gguf", backend="llama_cpp", source=str(smollm2_gguf()))
    made = LlamaCppBackend(config, LlamaCppOptions(n_ctx=512, parallel=4), BackendContext(tasks=frozenset({Task.CHAT})))
    await made.start()
    yield made
    await made.stop()


async def replies(backend: LlamaCppBackend, **sampling: Any) -> list[str]:
    def request(question: str) -> ChatRequest:
        return ChatRequest((ChatMessage("user", question),), SamplingParams(max_tokens=40, temperature=0, **sampling))

    alone = [(await collect(backend.chat(request(q)))).text for q in QUESTIONS[:1]]
    together = await asyncio.gather(*(collect(backend.chat(request(q))) for q in QUESTIONS))
    return alone + [generation.text for generation in together]


def count_chain_picks(backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A list that grows by one each time a sampler chain picks a token."""
    picks: list[bool] = []
    llama = backend._engine._llama  # type: ignore[union-attr]
    chain_sample = llama.llama_sampler_sample

    def counted(*args: Any) -> Any:
        picks.append(True)
        return chain_sample(*args)

    monkeypatch.setattr(llama, "llama_sampler_sample", counted)
    return picks


async def test_the_engines_argmax_equals_llamas_greedy_sampler(backend, monkeypatch) -> None:
    picks = count_chain_picks(backend, monkeypatch)
    by_argmax = await replies(backend)
    assert not picks  # greedy alone never reached the chain
    with monkeypatch.context() as chain_only:
        # Every new job's chain picks, as before the engine took the argmax itself.
        chain_only.setattr(Job, "argmax_only", property(lambda job: False, lambda job, value: None), raising=False)
        by_chain = await replies(backend)
    assert picks  # the chain did pick this time
    assert by_argmax == by_chain and all(by_argmax)


async def test_a_penalised_greedy_request_keeps_its_chain(backend, monkeypatch) -> None:
    picks = count_chain_picks(backend, monkeypatch)
    plain = await replies(backend)
    assert not picks
    # llama-cpp-python 0.3.36's penalties sampler takes the vocabulary size first: a request
    # with a penalty failed on the engine (a TypeError) until make_sampler passed it.
    penalised = await replies(backend, repetition_penalty=1.3, frequency_penalty=1.0)
    assert picks and all(penalised)
    assert penalised != plain  # the penalties took effect
