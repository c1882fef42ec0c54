"""Beam search as requests ask for it: llm-pool's `decoding.beam_size` and the completions
routes' `beam_size` become one `BeamSearch`; what cannot go with it is refused by the name
the client used; the pool sends it only to engines that declare it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from modelpool.capabilities import Capabilities, ModelCapabilities
from modelpool.config.schema import SamplingDefaults
from modelpool.errors import InvalidRequest
from modelpool.inference import BeamSearch, ChatMessage, ChatRequest, CompletionRequest
from modelpool.pool_api.generation import collect
from modelpool.tasks import Task
from modelpool.wire.openai.chat import ChatCompletionBody
from modelpool.wire.openai.responses import ResponsesBody
from tests.fakes import FakeBackend, SamplingRecorder, fake_slot, pool_of

# llm-pool's documented body (its README's "Inference Example"), beam_size raised from 1.
LLM_POOL_DECODING = {"beam_size": 4, "top_k": 1, "top_p": 1.0, "temperature": 0.1, "repetition_penalty": 1.0,
                     "max_tokens": 256}  # fmt: skip


def responses(**fields: Any) -> ResponsesBody:
    return ResponsesBody.model_validate({"model": "m", "input": "Hi", **fields})


def chat(**fields: Any) -> ChatCompletionBody:
    return ChatCompletionBody.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields})


def test_llm_pool_decoding_with_beams_is_a_deterministic_beam_search() -> None:
    sampling = responses(decoding=LLM_POOL_DECODING).sampling()
    assert sampling.beam == BeamSearch(4, 1.0, "decoding.beam_size")
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.max_tokens) == (0.0, 0, 1.0, 256)
    assert not sampling.unset & {"temperature", "top_p", "top_k", "min_p"}  # no model default makes it sample
    assert responses(decoding={**LLM_POOL_DECODING, "beam_size": 1}).sampling().beam is None


def test_chat_beam_size_and_length_penalty() -> None:
    sampling = chat(beam_size=3, length_penalty=0.5, max_tokens=8).sampling(max_tokens=8, logprobs=None)
    assert sampling.beam == BeamSearch(3, 0.5, "beam_size") and sampling.temperature == 0.0
    assert chat(beam_size=2, temperature=0, top_p=0.3, seed=7).sampling(max_tokens=None, logprobs=None).beam


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"decoding": {"beam_size": 4, "temperature": 0.7}}, "decoding.temperature"),
        ({"decoding": {"beam_size": 4, "top_p": 0.9}}, "decoding.top_p"),
        ({"decoding": {"beam_size": 4, "top_k": 40}}, "decoding.top_k"),
        ({"decoding": {"beam_size": 4}, "temperature": 1.0}, "temperature"),
        ({"decoding": {"length_penalty": 2.0}}, "decoding.length_penalty"),
    ],
)
def test_sampling_beside_beams_is_refused_by_its_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        responses(**fields).sampling()
    assert refused.value.param == param


def test_llm_pools_sampled_stream_body_with_beams_stays_a_400() -> None:
    """llm-pool's own streamed body (Bobcat/llm-pool tests/test_api.py,
    test_streaming_mode_returns_sse_events) with beam_size raised: CTranslate2 would draw the
    beams at random among the top 5, unseeded here; refused by name (docs/compatibility.md,
    llm-pool's "What differs in beam search")."""
    decoding = {"beam_size": 2, "top_k": 5, "top_p": 0.9, "temperature": 0.3, "repetition_penalty": 1.0,
                "max_tokens": 128, "stop": ["<|im_end|>"]}  # fmt: skip
    with pytest.raises(InvalidRequest) as refused:
        responses(input="Hello world", stream=True, decoding=decoding).sampling()
    assert refused.value.param in {"decoding.top_k", "decoding.top_p", "decoding.temperature"}
    assert "beam search does not sample" in refused.value.message


@pytest.mark.parametrize("size", [0, -1, 65, 10**12])
def test_beam_size_bounds(size: int) -> None:
    with pytest.raises(ValueError, match="beam_size"):
        responses(decoding={"beam_size": size})
    with pytest.raises(ValueError, match="beam_size"):
        chat(beam_size=size)


class Beamless(SamplingRecorder):
    """An engine without beam search (FakeBackend declares none)."""


class Beamy(Beamless):
    capabilities = replace(FakeBackend.capabilities, max_beam_size=3)


def beam_chat(**sampling: Any) -> ChatRequest:
    asked = responses(decoding={"beam_size": 2, "top_k": 1}).sampling()
    return ChatRequest((ChatMessage("user", "hi"),), replace(asked, **sampling))


async def test_the_pool_sends_beams_only_to_engines_that_declare_them() -> None:
    tasks = frozenset({Task.CHAT, Task.COMPLETION})
    defaults = SamplingDefaults(temperature=0.9, top_k=40)
    without = pool_of(fake_slot(Beamless(), tasks=tasks, sampling=defaults))
    with pytest.raises(InvalidRequest) as refused:
        await without.chat("fake", beam_chat())
    assert refused.value.param == "decoding.beam_size" and "no beam search" in refused.value.message
    with pytest.raises(InvalidRequest, match="no beam search"):
        await without.generate_all("fake", [CompletionRequest("x", beam_chat().sampling)])
    backend = Beamy()
    able = pool_of(fake_slot(backend, tasks=tasks, sampling=defaults))
    async with await able.chat("fake", beam_chat()) as stream:
        await collect(stream)
    assert backend.seen[-1].beam is not None and backend.seen[-1].temperature == 0.0  # not the model's 0.9
    with pytest.raises(InvalidRequest) as refused:
        await able.chat("fake", beam_chat(logprobs=2))
    assert refused.value.param == "logprobs"
    with pytest.raises(InvalidRequest, match="at most 3 beams") as refused:  # the model's own bound
        await able.chat("fake", beam_chat(beam=BeamSearch(4, param="decoding.beam_size")))
    assert refused.value.param == "decoding.beam_size"


class ShortBeams(Beamy):
    capabilities = replace(Beamy.capabilities, max_beam_tokens=8)


async def test_a_beam_search_is_as_long_as_the_models_max_beam_tokens_at_most() -> None:
    """It cannot be stopped once started: a longer ask is a 400 naming the client's field;
    one that asks no length, or gets the model's longer default, is cut at the bound."""
    tasks = frozenset({Task.CHAT, Task.COMPLETION})
    backend = ShortBeams()
    pool = pool_of(fake_slot(backend, tasks=tasks, sampling=SamplingDefaults(max_tokens=100)))
    with pytest.raises(InvalidRequest, match="at most 8 tokens") as refused:
        await pool.chat("fake", beam_chat(max_tokens=9, unset=frozenset()))
    assert refused.value.param == "decoding.max_tokens"
    completion = CompletionRequest("x", replace(beam_chat().sampling, max_tokens=9, unset=frozenset()))
    with pytest.raises(InvalidRequest, match="at most 8 tokens"):
        await pool.generate_all("fake", [completion])
    for asked in ({"max_tokens": 8, "unset": frozenset()}, {"max_tokens": None, "unset": frozenset({"max_tokens"})}):
        async with await pool.chat("fake", beam_chat(**asked)) as stream:
            await collect(stream)
        assert backend.seen[-1].max_tokens == 8  # the model's default (100) is cut too
    await pool.generate_all("fake", [CompletionRequest("x", replace(beam_chat().sampling, max_tokens=None))])
    assert backend.seen[-1].max_tokens == 8


def test_capabilities_show_beam_search() -> None:
    declared = Capabilities(tasks=frozenset({Task.CHAT}), max_beam_size=8)
    shown = [ModelCapabilities(declared.tasks, replace(declared, max_beam_size=n)).as_json() for n in (8, 0)]
    assert [(entry["beam_search"], entry["max_beam_size"]) for entry in shown] == [(True, 8), (False, None)]
