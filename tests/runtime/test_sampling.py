"""The pool fills what a request's client left out with the model's sampling defaults, as it
receives the request: callers never look the defaults up first."""

from __future__ import annotations

import pytest

from modelpool.config.schema import SamplingDefaults
from modelpool.errors import InvalidRequest
from modelpool.inference import ChatMessage, ChatRequest, CompletionRequest, SamplingParams
from modelpool.pool_api.generation import collect
from modelpool.runtime.sampling import with_model_defaults
from modelpool.tasks import Task
from tests.fakes import SamplingRecorder, fake_slot, pool_of

DEFAULTS = SamplingDefaults(temperature=0.2, top_k=40, max_tokens=64)


def test_only_what_the_client_left_out_takes_the_models_default() -> None:
    asked = SamplingParams(
        temperature=0.9, unset=frozenset({"temperature", "top_p", "top_k", "max_tokens"}) - {"temperature"}
    )
    resolved = with_model_defaults(asked, DEFAULTS)
    assert (resolved.temperature, resolved.top_k, resolved.max_tokens) == (0.9, 40, 64)
    assert resolved.top_p == 1.0, "a default the config leaves unset keeps OpenAI's"
    assert resolved.unset == frozenset()


def test_a_floor_above_the_models_default_cap_is_refused() -> None:
    asked = SamplingParams(min_tokens=100, unset=frozenset({"max_tokens"}))
    with pytest.raises(InvalidRequest) as refused:
        with_model_defaults(asked, DEFAULTS)
    assert refused.value.param == "min_tokens"
    assert with_model_defaults(SamplingParams(min_tokens=100), DEFAULTS).min_tokens == 100  # no default cap asked


async def test_the_pool_applies_the_models_defaults_on_receipt() -> None:
    backend = SamplingRecorder()
    pool = pool_of(fake_slot(backend, tasks=frozenset({Task.CHAT, Task.COMPLETION}), sampling=DEFAULTS))
    unset = frozenset({"temperature", "max_tokens"})
    async with await pool.chat("fake", ChatRequest((ChatMessage("user", "hi"),), SamplingParams(unset=unset))) as s:
        await collect(s)
    await pool.generate_all("fake", [CompletionRequest("x", SamplingParams(top_k=3, unset=unset))])
    assert [(p.temperature, p.max_tokens, p.top_k, p.unset) for p in backend.seen] == [
        (0.2, 64, 0, frozenset()),
        (0.2, 64, 3, frozenset()),
    ]
    await pool.close()
