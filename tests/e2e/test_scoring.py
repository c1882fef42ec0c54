"""The lm-eval path on the real SmolLM2 GGUF: echoed prompt logprobs, /loglikelihood and
/generate. The reference is llama.cpp's full logits matrix (`logits_all=True`) taken
directly, outside modelpool: log-softmax of row i-1 at token i. It runs the kernels the
engine runs (flash attention, llama.cpp's default, in micro-batches under 64 rows); plain
attention rounds differently, up to 0.1 nats on this Q4 model, as far from the float32
model either way."""

from __future__ import annotations

from typing import cast

import numpy as np
import openai
import pytest
from openai.types import CompletionUsage

from tests.conftest import CHAT_MODEL, EMBED_MODEL

TEXT = "The capital of France is Paris. The capital of Italy is Rome."


async def test_echo_returns_correct_prompt_logprobs(oai: openai.AsyncOpenAI, reference) -> None:
    tokenize, logprobs_of = reference
    reply = await oai.completions.create(model=CHAT_MODEL, prompt=TEXT, echo=True, logprobs=3, max_tokens=0)
    logprobs = reply.choices[0].logprobs
    assert reply.choices[0].text == TEXT and reply.choices[0].finish_reason == "length"
    assert logprobs is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = logprobs_of(tokenize(TEXT))
    np.testing.assert_allclose(logprobs.token_logprobs[1:], expected, atol=1e-4)
    assert "".join(logprobs.tokens) == TEXT
    assert all(len(top) == 3 for top in logprobs.top_logprobs[1:])
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 0


async def test_the_request_lm_eval_sends(http, reference) -> None:
    """local-completions: token-id prompts, echo, logprobs=1, max_tokens=1, temperature 0.
    It sums token_logprobs[ctxlen:-1]: every prompt token (first null) plus one entry for
    the generated token, which it drops."""
    tokenize, logprobs_of = reference
    context, continuation = "Question: what is two plus two? Answer:", " four"
    ids = [tokenize(context + continuation), tokenize("The sky is blue")]
    body = {"model": CHAT_MODEL, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    for choice, tokens in zip(response.json()["choices"], ids, strict=True):
        token_logprobs = choice["logprobs"]["token_logprobs"]
        assert len(token_logprobs) == len(tokens) + 1 and token_logprobs[0] is None
        np.testing.assert_allclose(token_logprobs[1:-1], logprobs_of(tokens), atol=1e-4)
        assert token_logprobs[-1] is not None  # the generated token's entry is there


async def test_loglikelihood_matches_the_echoed_logprobs_and_knows_greedy(http, reference) -> None:
    tokenize, logprobs_of = reference
    prompts = ["1, 2, 3, 4,", "The capital of France is", "The capital of France is"]
    continuations = [" 5", " Paris", " Banana"]
    response = await http.post(
        "/loglikelihood", json={"model": CHAT_MODEL, "prompts": prompts, "continuations": continuations}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    for prompt, continuation, ll in zip(prompts, continuations, body["ll"], strict=True):
        context, whole = tokenize(prompt), tokenize(prompt + continuation)
        expected = sum(logprobs_of(whole)[len(context) - 1 :])
        assert ll == pytest.approx(expected, abs=1e-3)
    assert body["is_greedy"] == [True, True, False]
    assert body["ll"][1] > body["ll"][2]
    assert body["usage"]["prompt_tokens"] > 0


async def test_generate_runs_a_batch_of_prompts(http, oai: openai.AsyncOpenAI) -> None:
    prompts = ["1, 2, 3, 4,", "The capital of France is"]
    response = await http.post(
        "/generate", json={"model": CHAT_MODEL, "prompts": prompts, "max_tokens": 6, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    single = [await oai.completions.create(model=CHAT_MODEL, prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert body["completions"] == [s.choices[0].text for s in single]
    # cast: the server always reports usage (the SDK's type allows none).
    assert body["usage"]["completion_tokens"] == sum(cast(CompletionUsage, s.usage).completion_tokens for s in single)
    assert len(body["finish_reasons"]) == 2


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/loglikelihood", {"model": CHAT_MODEL, "prompts": ["a", "b"], "continuations": ["c"]}, None, "invalid_value"),
        (
            "/loglikelihood",
            {"model": CHAT_MODEL, "prompts": ["a"], "continuations": [""]},
            "continuations",
            "invalid_value",
        ),
        (
            "/loglikelihood",
            {"model": EMBED_MODEL, "prompts": ["a"], "continuations": ["b"]},
            "model",
            "unsupported_task",
        ),
        (
            "/loglikelihood",
            {"model": CHAT_MODEL, "prompts": ["word " * 5000], "continuations": [" x"]},
            "prompt",
            "context_length_exceeded",
        ),
        ("/generate", {"model": CHAT_MODEL, "prompts": []}, "prompts", "invalid_value"),
        ("/generate", {"model": CHAT_MODEL, "prompts": ["a"], "stream": True}, "stream", "invalid_value"),
        ("/generate", {"model": EMBED_MODEL, "prompts": ["a"]}, "model", "unsupported_task"),
    ],
)
async def test_scoring_bad_requests(http, path: str, body: dict, param: str | None, code: str) -> None:
    response = await http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    if code == "unsupported_task":
        assert EMBED_MODEL in error["message"] and "embedding" in error["message"]
