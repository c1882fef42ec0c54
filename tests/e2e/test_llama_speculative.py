"""Speculative decoding in the llama.cpp engine, on the real SmolLM2 GGUF: with the model as
its own draft (guesses nearly always right) and with a tiny random draft sharing its
tokenizer (guesses mostly wrong, so rejection runs all the time), greedy and seeded output
equals the same request without a draft — streamed or not, alone or in a busy batch, with
stop strings, max_tokens, a grammar and logprobs — and the acceptance rate is reported in
the request's timing metrics and on /metrics. A draft with another vocabulary is refused
at load; out-of-bounds settings are refused at startup and at load time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from openai.types.chat import ChatCompletionMessageParam

from modelpool.backends.registry import parse_options
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError, ModelLoadFailed
from tests.conftest import sdk, serving
from tests.draft_gguf import RESPELLED_TOKEN, foreign_vocab_gguf, random_draft_gguf
from tests.e2e.conftest import smollm2_gguf
from tests.e2e.test_llama_batching import QUESTIONS

PLAIN, SELF_DRAFT, RANDOM_DRAFT, FOREIGN_DRAFT = "spec-plain", "spec-self", "spec-random", "spec-foreign"
OPTIONS = {"n_ctx": 1024, "parallel": 4}


def entry(speculative: dict[str, Any] | None, preload: bool = True) -> dict[str, Any]:
    options = OPTIONS if speculative is None else {**OPTIONS, "speculative": speculative}
    return {"backend": "llama_cpp", "source": str(smollm2_gguf()), "preload": preload,
            "tasks": ["chat", "completion"], "options": options}  # fmt: skip


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    models = {
        PLAIN: entry(None),
        # n_min 3: a draft the p_min cut short is dropped (its evaluated guesses leave the draft cache).
        SELF_DRAFT: entry({"draft": str(smollm2_gguf()), "n_max": 6, "n_min": 3, "p_min": 0.5}),
        # p_min 0: the random draft always guesses its n_max tokens, and is nearly always wrong.
        RANDOM_DRAFT: entry({"draft": str(random_draft_gguf()), "n_max": 3, "p_min": 0.0}),
        FOREIGN_DRAFT: entry({"draft": str(foreign_vocab_gguf())}, preload=False),
    }
    async with serving({"enabled_models": list(models), "models": models}) as (app, client):
        for model in (PLAIN, SELF_DRAFT, RANDOM_DRAFT):
            await app.state.pool.slot(model).ensure_ready(None)
        yield app, client


def engine_of(app: FastAPI, model: str) -> Any:
    return app.state.pool.slot(model).replicas.members[0].backend._engine


async def chat(client: openai.AsyncOpenAI, model: str, question: str, **extra: Any) -> tuple[str, str | None]:
    body: dict[str, Any] = {"max_tokens": 40, "temperature": 0, **extra}
    reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}], **body)
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


async def streamed(client: openai.AsyncOpenAI, model: str, question: str, **extra: Any) -> tuple[str, str | None]:
    body: dict[str, Any] = {"max_tokens": 40, "temperature": 0, **extra}
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], stream=True, **body
    )
    text, reason = "", None
    async for event in stream:
        if event.choices:
            text += event.choices[0].delta.content or ""
            reason = event.choices[0].finish_reason or reason
    return text, reason


@pytest.mark.parametrize("model", [SELF_DRAFT, RANDOM_DRAFT])
async def test_greedy_output_equals_no_draft_alone_streamed_and_in_a_busy_batch(served, model: str) -> None:
    _, client = served
    oai = sdk(client)
    questions = QUESTIONS[:6]
    plain = [await chat(oai, PLAIN, q) for q in questions]
    assert [await chat(oai, model, q) for q in questions[:3]] == plain[:3]
    assert [await streamed(oai, model, q) for q in questions[3:4]] == plain[3:4]
    # Six requests on four sequences: the batch fills, thins out and refills while drafting.
    together = await asyncio.gather(
        *(chat(oai, model, q) for q in questions[:3]), *(streamed(oai, model, q) for q in questions[3:])
    )
    assert list(together) == plain


async def test_a_long_conversation_with_guesses_past_512_cells_equals_no_draft(served) -> None:
    """Past 256 positions a micro-batch of one row takes another attention kernel: the
    guesses must not leave one (engine.py `_no_lone_row`), alone or beside others."""
    _, client = served
    oai = sdk(client)
    story = " ".join(f"On day {day} the travellers walked to the next village and rested." for day in range(1, 25))
    question = f"{story}\nSummarise the journey."
    plain = await chat(oai, PLAIN, question, max_tokens=60, extra_body={"ignore_eos": True})
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        assert await chat(oai, model, question, max_tokens=60, extra_body={"ignore_eos": True}) == plain
        together = await asyncio.gather(
            chat(oai, model, question, max_tokens=60, extra_body={"ignore_eos": True}),
            *(chat(oai, model, q, max_tokens=5) for q in QUESTIONS[:2]),
        )
        assert together[0] == plain


async def test_seeded_sampling_equals_no_draft(served) -> None:
    """Each position is sampled by the sequence's own chain, one draw per emitted token as
    without a draft: the same seed gives the same text."""
    _, client = served
    oai = sdk(client)
    seeded: dict[str, Any] = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_tokens": 40}
    plain = await chat(oai, PLAIN, "Write a story about a dragon.", **seeded)
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        busy = [chat(oai, model, q, temperature=1.0) for q in QUESTIONS[:2]]
        results = await asyncio.gather(chat(oai, model, "Write a story about a dragon.", **seeded), *busy)
        assert results[0] == plain


async def test_max_tokens_and_stop_strings_cut_exactly(served) -> None:
    _, client = served
    oai = sdk(client)
    for max_tokens in (1, 2, 7):
        body = {"model": SELF_DRAFT, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        reply = (await client.post("/v1/completions", json=body)).json()
        assert reply["usage"]["completion_tokens"] == max_tokens and reply["choices"][0]["finish_reason"] == "length"
        plain = (await client.post("/v1/completions", json={**body, "model": PLAIN})).json()
        assert reply["choices"][0]["text"] == plain["choices"][0]["text"]
    full, _ = await chat(oai, PLAIN, "Count to ten.")
    stop = full.split()[2]  # a word in the middle of the answer
    expected = await chat(oai, PLAIN, "Count to ten.", stop=[stop])
    assert expected[1] == "stop" and stop not in expected[0]
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        assert await chat(oai, model, "Count to ten.", stop=[stop]) == expected
        assert await streamed(oai, model, "Count to ten.", stop=[stop]) == expected


async def test_a_grammar_and_logprobs_hold_under_speculation(served) -> None:
    _, client = served
    oai = sdk(client)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Rome as JSON."}]
    ask: dict[str, Any] = {"max_tokens": 30, "temperature": 0, "response_format": response_format,
                           "logprobs": True, "top_logprobs": 2}  # fmt: skip
    plain = await oai.chat.completions.create(model=PLAIN, messages=messages, **ask)
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        drafted = await oai.chat.completions.create(model=model, messages=messages, **ask)
        assert drafted.choices[0].message.content == plain.choices[0].message.content
        assert drafted.choices[0].logprobs == plain.choices[0].logprobs


async def test_the_acceptance_rate_is_in_the_timing_metrics_and_on_metrics(served) -> None:
    app, client = served
    oai = sdk(client)
    rates = {}
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        reply = await oai.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=40, temperature=0,
            extra_body={"return_metrics": True, "ignore_eos": True},
        )  # fmt: skip
        metrics = reply.http_response.json()["metrics"]
        assert metrics["draft_tokens"] > 0 and 0 <= metrics["draft_accepted_tokens"] <= metrics["draft_tokens"]
        assert metrics["draft_acceptance_rate"] == round(metrics["draft_accepted_tokens"] / metrics["draft_tokens"], 4)
        # Never more accepted guesses than tokens after the first (each step's first token is the model's own).
        assert metrics["draft_accepted_tokens"] <= metrics["output_tokens"] - 1
        rates[model] = metrics["draft_acceptance_rate"]
    assert rates[SELF_DRAFT] >= 0.8  # its own guesses: only rounding (another batch shape) may differ
    assert rates[RANDOM_DRAFT] < rates[SELF_DRAFT]
    hi = {"model": PLAIN, "max_tokens": 4, "return_metrics": True, "messages": [{"role": "user", "content": "Hi"}]}
    plain = await client.post("/v1/chat/completions", json=hi)
    assert "draft_tokens" not in plain.json()["metrics"]  # no draft: no draft counts
    responses = await client.post("/v1/responses", json={"model": SELF_DRAFT, "input": "Hi", "max_output_tokens": 8})
    assert responses.json()["metrics"]["draft_tokens"] >= 0
    scraped = (await client.get("/metrics")).text
    for model in (SELF_DRAFT, RANDOM_DRAFT):
        engine = engine_of(app, model)
        assert engine.drafted_tokens > 0 and 0 <= engine.accepted_tokens <= engine.drafted_tokens
        assert f'modelpool_draft_tokens_total{{model="{model}"}}' in scraped
        assert f'modelpool_draft_accepted_tokens_total{{model="{model}"}}' in scraped


async def test_a_draft_with_another_vocabulary_is_refused_at_load(served) -> None:
    app, _ = served
    with pytest.raises(ModelLoadFailed) as refused:
        await app.state.pool.slot(FOREIGN_DRAFT).ensure_ready(None)
    message = str(refused.value)
    assert FOREIGN_DRAFT in message and str(foreign_vocab_gguf()) in message
    assert f"token {RESPELLED_TOKEN}" in message and "zzqx" in message


@pytest.mark.parametrize(
    ("speculative", "field"),
    [({"draft": "x.gguf", "n_max": 33}, "n_max"), ({"draft": "x.gguf", "p_min": 1.5}, "p_min"),
     ({"draft": ""}, "draft"), ({"draft": "x.gguf", "n_ctx": 8}, "n_ctx"), ({"n_max": 4}, "draft"),
     ({"draft": "x.gguf", "guesses": 4}, "guesses")],
)  # fmt: skip
def test_out_of_bounds_settings_are_a_config_error(speculative: dict[str, Any], field: str) -> None:
    model = ModelConfig(id=PLAIN, backend="llama_cpp", source=str(smollm2_gguf()),
                        options={**OPTIONS, "speculative": speculative})  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        parse_options(model)  # what startup runs on every configured model before loading any
    assert f"speculative.{field}" in refused.value.message


async def test_load_time_overrides_are_bounded(served) -> None:
    _, client = served
    load = f"/v1/admin/models/{FOREIGN_DRAFT}/load"
    refused = await client.post(load, json={"overrides": {"speculative": {"draft": "x.gguf", "n_max": 64}}})
    assert refused.status_code == 400 and "n_max" in refused.text
    # The load form is generated from this schema: the nested option's bounds must reach it.
    listed = (await client.get("/v1/admin/models")).json()
    (model,) = [m for m in listed["data"] if m["id"] == FOREIGN_DRAFT]
    (option,) = [o for o in model["override_options"] if o["name"] == "speculative"]
    fields = option["schema"]["properties"]
    assert fields["n_max"]["maximum"] == 32 and fields["p_min"]["maximum"] == 1.0, option
