"""The CTranslate2 backend on SmolLM2 (the starter GGUF, converted once to CT2 int8): the
generation checks the other LLM backends pass, batching (a burst shares one batch; greedy
answers in a batch equal each alone), cancellation, and prompt scoring against a direct
CT2 computation on the same converted folder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from modelpool.backends.ctranslate2.convert import ct2_folder_for
from modelpool.config.sources import HubLocation
from modelpool.inference import ChatMessage, ChatRequest, SamplingParams
from modelpool.pool_api.generation import collect
from tests.conftest import CT2_MODEL, sdk, serving
from tests.e2e.conftest import smollm2_gguf
from tests.e2e.stop_checks import assert_stop_across_tokens_never_leaks
from tests.polling import until

# A burst gathered this long always shares a batch, so what these tests see does not hang
# on how fast this machine submits requests (the default, 5 ms, is tuned for latency).
GATHER_MS = 150
TEXT = "The capital of France is Paris. The capital of Italy is Rome."


@pytest.fixture(scope="session")
def ct2_folder() -> Path:
    """The converted model: the first session on a machine pays the conversion (~20 s),
    later ones find it in the work dir (the server's load below then converts nothing)."""
    return ct2_folder_for(smollm2_gguf(), HubLocation.work_dir, "int8")


@pytest.fixture(scope="module")
async def ct2(ct2_folder: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    cli = {
        "enabled_models": [CT2_MODEL],
        "models": {CT2_MODEL: {"preload": True, "options": {"batch_gather_ms": GATHER_MS}}},
    }
    async with serving(cli) as (app, client):
        await app.state.pool.slot(CT2_MODEL).ensure_ready(None)
        yield app, client


@pytest.fixture(scope="module")
def direct(ct2_folder: Path) -> tuple[Any, Any]:
    """The same CT2 folder, loaded outside modelpool: (generator, tokenizer)."""
    import ctranslate2
    from transformers import AutoTokenizer

    return ctranslate2.Generator(str(ct2_folder), compute_type="int8"), AutoTokenizer.from_pretrained(ct2_folder)


def engine_of(app: Any) -> Any:
    return app.state.pool.slot(CT2_MODEL).replicas.members[0].backend._engine


def chat(text: str, **sampling: Any) -> ChatRequest:
    return ChatRequest((ChatMessage("user", text),), SamplingParams(**{"max_tokens": 24, "temperature": 0, **sampling}))


async def answer(pool: Any, request: ChatRequest) -> str:
    return (await collect(await pool.chat(CT2_MODEL, request))).text


async def test_openai_sdk_chat_streamed_and_whole_agree(ct2) -> None:
    _, client = ct2
    oai = sdk(client)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
    whole = await oai.chat.completions.create(model=CT2_MODEL, messages=messages, max_tokens=30, temperature=0)
    stream = await oai.chat.completions.create(
        model=CT2_MODEL, messages=messages, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text.strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert whole.usage is not None and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens <= 30
    assert whole.usage.prompt_tokens == 34  # SmolLM2's template with its default system message


async def test_completions_text_and_token_ids_agree_and_echo(ct2, direct) -> None:
    _, client = ct2
    oai = sdk(client)
    _, tokenizer = direct
    prompt = "The capital of France is"
    text = await oai.completions.create(model=CT2_MODEL, prompt=prompt, max_tokens=8, temperature=0)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    by_ids = await oai.completions.create(model=CT2_MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert text.usage is not None
    assert by_ids.choices[0].text == text.choices[0].text and text.usage.prompt_tokens == len(ids)
    echoed = await oai.completions.create(model=CT2_MODEL, prompt=prompt, max_tokens=8, temperature=0, echo=True)
    assert echoed.choices[0].text == prompt + text.choices[0].text


async def test_stop_strings_never_leak_even_split_across_tokens(ct2) -> None:
    _, client = ct2
    await assert_stop_across_tokens_never_leaks(sdk(client), CT2_MODEL)


async def test_max_tokens_ignore_eos_and_min_tokens(ct2) -> None:
    _, client = ct2
    oai = sdk(client)
    say_ok: dict[str, Any] = {
        "model": CT2_MODEL,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 48,
    }
    plain = await oai.chat.completions.create(**say_ok, temperature=0)
    answer_text = plain.choices[0].message.content
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens <= 32  # the premise
    forced = await oai.chat.completions.create(**say_ok, temperature=0, extra_body={"ignore_eos": True})
    assert (forced.choices[0].finish_reason, forced.usage.completion_tokens) == ("length", 48)
    assert forced.choices[0].message.content.startswith(answer_text)  # only the end was ruled out
    floor = plain.usage.completion_tokens + 8
    held = await oai.chat.completions.create(
        **say_ok, temperature=0, stop=[answer_text[:2]], extra_body={"min_tokens": floor}
    )
    assert held.usage.completion_tokens >= floor and held.choices[0].message.content.startswith(answer_text)
    capped = await oai.chat.completions.create(**{**say_ok, "max_tokens": 5}, temperature=0.9, top_p=0.95,
                                               extra_body={"ignore_eos": True})  # fmt: skip
    assert (capped.choices[0].finish_reason, capped.usage.completion_tokens) == ("length", 5)


async def test_logprobs_of_generated_tokens_with_alternatives(ct2) -> None:
    _, client = ct2
    reply = await sdk(client).chat.completions.create(
        model=CT2_MODEL, messages=[{"role": "user", "content": "Say OK."}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    assert reply.choices[0].logprobs is not None
    content = reply.choices[0].logprobs.content
    assert content is not None
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:  # greedy: each token is its step's most likely one
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob, abs=1e-4) and token.logprob <= 0


async def test_a_burst_shares_one_batch_and_greedy_answers_equal_each_alone(ct2, direct) -> None:
    app, _ = ct2
    pool, engine = app.state.pool, engine_of(app)
    _, tokenizer = direct
    same_length = [f"Describe the color {color}." for color in ("red", "blue", "green", "black")]
    lengths = {len(tokenizer(p)["input_ids"]) for p in same_length}
    assert len(lengths) == 1, lengths  # the premise: equal prompts are fed to CT2 the same way alone or together
    alone = [await answer(pool, chat(p)) for p in same_length]
    batches_before = engine.batches_run
    together = await asyncio.gather(*(answer(pool, chat(p)) for p in same_length))
    assert list(together) == alone
    assert engine.batches_run - batches_before == 1  # all four in one batch


async def test_prompts_of_different_lengths_share_a_batch_and_the_shortest_match_alone(ct2, direct) -> None:
    """CT2 feeds a longer prompt's extra tokens step by step in a batch; in int8 that changes
    its numbers a little, so its greedy answer may differ from alone (measured: 5 of 7 such
    rows on the benchmark prompts). The shortest prompts are fed exactly as alone."""
    app, _ = ct2
    pool, engine = app.state.pool, engine_of(app)
    _, tokenizer = direct
    prompts = ["What is 2+2?", "Name three animals.", "Describe Paris.", "Write a poem about the sea.", "Hi."]
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    assert max(lengths) - min(lengths) <= 8  # the premise: within the default spread
    alone = [await answer(pool, chat(p)) for p in prompts]
    batches_before = engine.batches_run
    together = await asyncio.gather(*(answer(pool, chat(p)) for p in prompts))
    assert engine.batches_run - batches_before == 1
    shortest = [i for i, n in enumerate(lengths) if n == min(lengths)]
    assert [together[i] for i in shortest] == [alone[i] for i in shortest]
    differ = sum(a != b for a, b in zip(alone, together, strict=True))
    print(f"\n{differ} of {len(prompts) - len(shortest)} longer prompts answered differently in the batch")


async def test_a_sampled_request_with_a_seed_is_refused_and_a_greedy_one_is_not(ct2) -> None:
    _, client = ct2
    oai = sdk(client)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Invent a name for a cat."}]
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.chat.completions.create(model=CT2_MODEL, messages=messages, max_tokens=8, temperature=1, seed=7)
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == "seed"
    greedy = [
        await oai.chat.completions.create(model=CT2_MODEL, messages=messages, max_tokens=8, temperature=0, seed=7)
        for _ in range(2)
    ]
    assert greedy[0].choices[0].message.content == greedy[1].choices[0].message.content


async def test_a_cancelled_request_leaves_its_batch(ct2) -> None:
    app, _ = ct2
    pool, engine = app.state.pool, engine_of(app)
    stream = await pool.chat(CT2_MODEL, chat("Write a very long story.", max_tokens=2000, ignore_eos=True))
    try:
        async for chunk in stream:
            if chunk.text:
                break
        assert engine.generator.num_active_batches == 1
    finally:
        await stream.aclose()
    await until(lambda: engine.in_flight == 0, "the cancelled request to leave", timeout_s=5)
    await until(lambda: engine.generator.num_active_batches == 0, "CT2 to end the batch", timeout_s=5)


def direct_logprobs(generator: Any, tokens: list[int]) -> list[float]:
    logits = np.asarray(generator.forward_batch([tokens])).astype(np.float64)[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return [float(log_softmax[i - 1][tokens[i]]) for i in range(1, len(tokens))]


async def test_echo_logprobs_equal_a_direct_ct2_computation(ct2, direct) -> None:
    _, client = ct2
    generator, tokenizer = direct
    tokens = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    body = {"model": CT2_MODEL, "prompt": [tokens], "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0}
    response = await client.post("/v1/completions", json=body)  # what lm-eval sends
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(tokens) + 1 and logprobs["token_logprobs"][0] is None
    np.testing.assert_allclose(logprobs["token_logprobs"][1:-1], direct_logprobs(generator, tokens), atol=1e-3)
    assert logprobs["token_logprobs"][-1] is not None  # the generated token's entry
    assert all(len(top) == 2 for top in logprobs["top_logprobs"][1:])


async def test_loglikelihood_ranks_and_knows_greedy(ct2, direct) -> None:
    _, client = ct2
    generator, tokenizer = direct
    prompts = ["1, 2, 3, 4,", "The capital of France is", "The capital of France is"]
    continuations = [" 5", " Paris", " a city of light"]
    response = await client.post(
        "/loglikelihood", json={"model": CT2_MODEL, "prompts": prompts, "continuations": continuations}
    )
    assert response.status_code == 200, response.text
    result = response.json()
    for prompt, continuation, ll in zip(prompts, continuations, result["ll"], strict=True):
        context = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        whole = tokenizer(prompt + continuation, add_special_tokens=False)["input_ids"]
        assert ll == pytest.approx(sum(direct_logprobs(generator, whole)[len(context) - 1 :]), abs=1e-3 * len(whole))
    assert result["is_greedy"] == [True, True, False]
    assert result["ll"][1] > result["ll"][2]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"extra_body": {"min_p": 0.1}}, "min_p"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
async def test_what_it_cannot_do_is_a_clear_400(ct2, fields: dict[str, Any], param: str) -> None:
    _, client = ct2
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(client).chat.completions.create(
            model=CT2_MODEL, messages=[{"role": "user", "content": "Hi."}], **{"max_tokens": 4, **fields}
        )
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == param


async def test_a_token_id_outside_the_vocabulary_is_a_400(ct2) -> None:
    _, client = ct2
    response = await client.post("/v1/completions", json={"model": CT2_MODEL, "prompt": [1, 99_999], "max_tokens": 2})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


# ----- beam search (issue 31: llm-pool honours `decoding.beam_size` on CTranslate2) -----------

# llm-pool's documented request body (its README, "Inference Example" and the decoding-field
# table: `beam_size` is "used" on CT2), with `beam_size` raised from the example's 1 and a
# shorter `max_tokens`. Read in the public reference corpus (llm-pool's README.md).
LLM_POOL_BODY: dict[str, Any] = {
    "model": CT2_MODEL,
    "input": "The weather is pleasant today, and I would like to take a walk in the park after lunch.",
    "instructions": "Translate to Dutch. Return only the translation.",
    "stream": False,
    "decoding": {"beam_size": 4, "top_k": 1, "top_p": 1.0, "temperature": 0.1, "repetition_penalty": 1.0,
                 "max_tokens": 24},
}  # fmt: skip
BEAM_PROMPT = "The capital of France is"


def backend_of(app: Any) -> Any:
    return app.state.pool.slot(CT2_MODEL).replicas.members[0].backend


def direct_beam(direct: tuple[Any, Any], ids: list[int], end_ids: list[int], beam: int, max_new: int) -> list[int]:
    """CT2's own search on the same folder, run outside modelpool: the answer's ids, its
    end token dropped."""
    generator, tokenizer = direct
    result = generator.generate_batch(
        [tokenizer.convert_ids_to_tokens(ids)],
        max_length=max_new,
        beam_size=beam,
        include_prompt_in_result=False,
        return_end_token=True,
        end_token=end_ids,
    )
    return [t for t in result[0].sequences_ids[0] if t not in end_ids]


async def test_beam_search_is_ct2s_own_and_not_greedy(ct2, direct) -> None:
    app, client = ct2
    backend = backend_of(app)
    ids, end_ids = await backend.tokenize(BEAM_PROMPT), sorted(backend._end_ids)
    beam, greedy = direct_beam(direct, ids, end_ids, 4, 24), direct_beam(direct, ids, end_ids, 1, 24)
    assert beam != greedy  # else this test could not tell beam search from greedy decoding
    expected = direct[1].decode(beam)
    body = {"model": CT2_MODEL, "prompt": BEAM_PROMPT, "max_tokens": 24, "beam_size": 4, "temperature": 0}
    whole = (await client.post("/v1/completions", json=body)).json()
    assert whole["choices"][0]["text"] == expected and whole["usage"]["completion_tokens"] == len(beam)
    plain = await sdk(client).completions.create(model=CT2_MODEL, prompt=BEAM_PROMPT, max_tokens=24, temperature=0)
    assert plain.choices[0].text == direct[1].decode(greedy)
    # Streamed: the answer is known only at the search's end, then streamed as it is.
    stream = await sdk(client).completions.create(model=CT2_MODEL, prompt=BEAM_PROMPT, max_tokens=24, stream=True,
                                                  extra_body={"beam_size": 4, "top_k": 1})  # fmt: skip
    assert "".join([chunk.choices[0].text async for chunk in stream if chunk.choices]) == expected
    # A stop string cuts the search's answer where it first appears.
    cut = expected.index(" Rome") if " Rome" in expected else len(expected) // 2
    stop = expected[cut : cut + 5]
    stopped = (await client.post("/v1/completions", json={**body, "stop": [stop]})).json()["choices"][0]
    assert stopped["text"] == expected[: expected.index(stop)] and stopped["finish_reason"] == "stop"
    # The HRM-style batch route takes it too: several prompts, each CT2's own search.
    generate = {"model": CT2_MODEL, "prompts": [BEAM_PROMPT] * 2, "max_tokens": 24, "beam_size": 4, "top_k": 1}
    batch = (await client.post("/generate", json=generate)).json()
    assert batch["completions"] == [expected] * 2


async def test_llm_pool_body_with_beams_equals_ct2s_own_search(ct2, direct) -> None:
    app, client = ct2
    backend = backend_of(app)
    said = (ChatMessage("system", LLM_POOL_BODY["instructions"]), ChatMessage("user", LLM_POOL_BODY["input"]))
    ids = await backend.encode_chat(ChatRequest(said), True)
    end_ids = sorted(backend._end_ids)
    beam, greedy = direct_beam(direct, ids, end_ids, 4, 24), direct_beam(direct, ids, end_ids, 1, 24)
    assert beam != greedy
    reply = (await client.post("/v1/responses", json=LLM_POOL_BODY)).json()
    text = "".join(part["text"] for item in reply["output"] for part in item.get("content", []))
    assert text == direct[1].decode(beam) and reply["usage"]["output_tokens"] == len(beam)
    listed = (await client.get(f"/v1/models/{CT2_MODEL}")).json()
    assert listed["capabilities"]["beam_search"] is True and listed["capabilities"]["max_beam_size"] == 16


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"temperature": 0.8}, "temperature"),
        ({"extra_body": {"beam_size": 17}}, "beam_size"),  # over the model's max_beam_size (16)
        ({"presence_penalty": 0.5, "temperature": 0}, "presence_penalty"),
    ],
)
async def test_what_beam_search_cannot_combine_with_is_a_clear_400(ct2, fields: dict[str, Any], param: str) -> None:
    _, client = ct2
    extra = {"beam_size": 4, **fields.pop("extra_body", {})}
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(client).chat.completions.create(model=CT2_MODEL, messages=[{"role": "user", "content": "Hi."}],
                                                  max_tokens=4, extra_body=extra, **fields)  # fmt: skip
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == param


async def test_max_beam_size_bounds_a_models_beams(ct2) -> None:
    _, client = ct2
    load = f"/v1/admin/models/{CT2_MODEL}/load"
    refused = await client.post(load, json={"overrides": {"max_beam_size": 65}})
    assert refused.status_code == 400 and "max_beam_size" in refused.text
    too_long = await client.post(load, json={"overrides": {"max_beam_tokens": 4097}})
    assert too_long.status_code == 400 and "max_beam_tokens" in too_long.text
    bounds = {"max_beam_size": 2, "max_beam_tokens": 4}
    assert (await client.post(load, json={"overrides": bounds})).status_code == 200
    try:
        body = {"model": CT2_MODEL, "input": "Hi"}
        decoding = {"beam_size": 3, "top_k": 1, "max_tokens": 4}
        wide = await client.post("/v1/responses", json={**body, "decoding": decoding})
        assert wide.status_code == 400 and wide.json()["error"]["param"] == "decoding.beam_size"
        assert "at most 2 beams" in wide.json()["error"]["message"]
        narrow = await client.post("/v1/responses", json={**body, "decoding": {**decoding, "beam_size": 2}})
        assert narrow.status_code == 200, narrow.text
        # A search cannot be stopped once started: its length is bounded (max_beam_tokens)
        longer = {**decoding, "beam_size": 2, "max_tokens": 5}
        long = await client.post("/v1/responses", json={**body, "decoding": longer})
        assert long.status_code == 400 and long.json()["error"]["param"] == "decoding.max_tokens", long.text
        unbounded = {"model": CT2_MODEL, "prompt": "Once upon a time", "beam_size": 2, "ignore_eos": True}
        cut = (await client.post("/v1/completions", json=unbounded)).json()
        assert cut["usage"]["completion_tokens"] == 4 and cut["choices"][0]["finish_reason"] == "length"
    finally:
        await client.post(load, json={"overrides": {"max_beam_size": 16, "max_beam_tokens": 512}})
