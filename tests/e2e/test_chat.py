"""Chat completions through the official openai SDK against the real SmolLM2 GGUF."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import CHAT_MODEL
from tests.e2e.stop_checks import assert_stop_across_tokens_never_leaks

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
# A short answer that ends by itself.
SAY_OK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say OK."}]
SYSTEM_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(*turns: tuple[str, object]) -> str:
    """SmolLM2's template written out by hand, to check the server rendered the model's own."""
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + "<|im_start|>assistant\n"


async def test_non_streaming_answer_has_text_usage_and_finish_reason(oai: openai.AsyncOpenAI, vocab) -> None:
    reply = await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content is not None
    assert choice.message.content.strip()
    assert choice.finish_reason in {"stop", "length"}
    assert reply.model == CHAT_MODEL and reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    expected_prompt = vocab.tokenize(
        chatml(("system", SYSTEM_DEFAULT), ("user", HI[0]["content"])).encode(), add_bos=False, special=True
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(expected_prompt)
    assert 0 < reply.usage.completion_tokens <= 40
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_multi_turn_messages_are_rendered_with_the_models_template(oai: openai.AsyncOpenAI, vocab) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Sky color?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Grass color?"},
    ]
    reply = await oai.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=3)
    rendered = chatml(*((m["role"], m["content"]) for m in messages))
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(vocab.tokenize(rendered.encode(), add_bos=False, special=True))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_token_cap_ends_with_length(oai: openai.AsyncOpenAI, field: str) -> None:
    cap: dict[str, Any] = {field: 6}
    reply = await oai.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        temperature=0,
        extra_body={"ignore_eos": True},  # the cap, not the model, must end it on any machine
        **cap,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6


async def test_stream_matches_non_stream_and_reports_usage(oai: openai.AsyncOpenAI) -> None:
    whole = await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, max_tokens=30, temperature=0)
    stream = await oai.chat.completions.create(
        model=CHAT_MODEL,
        messages=HI,
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_stream_ends_with_done_marker(http) -> None:
    body = {"model": CHAT_MODEL, "messages": HI, "max_tokens": 3, "stream": True}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


async def test_same_seed_same_output_different_seed_differs(oai: openai.AsyncOpenAI) -> None:
    async def sample(seed: int) -> str | None:
        reply = await oai.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "Invent a name for a cat."}],
            max_tokens=24,
            temperature=1.0,
            top_p=1.0,
            seed=seed,
        )
        return reply.choices[0].message.content

    first, again = await sample(1234), await sample(1234)
    assert first == again
    others = {await sample(seed) for seed in (1, 2, 3)}
    assert others - {first}, "three other seeds all reproduced seed 1234's text"


async def test_stop_text_is_not_returned(oai: openai.AsyncOpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Count from 1 to 20, separated by commas."}
    ]
    # ignore_eos: all 40 tokens, whatever this machine's llama.cpp decodes.
    greedy: dict[str, Any] = {"max_tokens": 40, "temperature": 0, "extra_body": {"ignore_eos": True}}
    free = await oai.chat.completions.create(model=CHAT_MODEL, messages=messages, **greedy)
    text = free.choices[0].message.content
    assert text is not None
    stop = text[len(text) // 2 :][:2]  # cut from this run's own answer, so it surely occurs
    assert len(stop) == 2, text
    stopped = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=messages, stop=[stop, "never-appears"], **greedy
    )
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


async def test_stop_split_across_tokens_never_leaks(oai: openai.AsyncOpenAI) -> None:
    await assert_stop_across_tokens_never_leaks(oai, CHAT_MODEL)


async def test_logprobs_and_top_logprobs_for_generated_tokens(oai: openai.AsyncOpenAI) -> None:
    reply = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=HI, max_tokens=12, temperature=0, logprobs=True, top_logprobs=3
    )
    assert reply.choices[0].logprobs is not None
    content = reply.choices[0].logprobs.content
    assert reply.usage is not None
    assert content is not None
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        top = [t.logprob for t in entry.top_logprobs]
        assert top == sorted(top, reverse=True)
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely token
        assert entry.logprob == pytest.approx(top[0])
        assert entry.bytes is not None
        assert bytes(entry.bytes).decode() == entry.token


async def test_n_other_than_one_is_a_clear_400(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.chat.completions.create(model=CHAT_MODEL, messages=HI, n=2)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "n" and "n=1" in error["message"]


async def test_model_alias_answers_with_the_canonical_id(oai: openai.AsyncOpenAI) -> None:
    reply = await oai.chat.completions.create(model="smollm2", messages=HI, max_tokens=2)
    assert reply.model == CHAT_MODEL


async def test_stream_chunks_carry_usage_null_until_the_last(http) -> None:
    body = {
        "model": CHAT_MODEL,
        "messages": HI,
        "max_tokens": 3,
        "ignore_eos": True,  # sampled: without it, an early end-of-sequence makes it shorter
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = [e for e in (await http.post("/v1/chat/completions", json=body)).text.split("\n\n") if e]
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["choices"] == []


async def test_ignore_eos_runs_an_answer_that_would_stop_to_max_tokens(oai: openai.AsyncOpenAI) -> None:
    plain = await oai.chat.completions.create(model=CHAT_MODEL, messages=SAY_OK, max_tokens=64, temperature=0)
    assert plain.usage is not None
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 64  # the premise
    for temperature in (0.0, 1.0):  # greedy and sampled: neither may end at end-of-sequence
        reply = await oai.chat.completions.create(
            model=CHAT_MODEL,
            messages=SAY_OK,
            max_tokens=64,
            temperature=temperature,
            seed=1,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage is not None
        assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == ("length", 64)
        if temperature == 0:  # only the end was ruled out: greedy says the same up to there
            assert reply.choices[0].message.content is not None
            assert plain.choices[0].message.content is not None
            assert reply.choices[0].message.content.startswith(plain.choices[0].message.content)


async def test_min_tokens_holds_off_end_of_sequence_and_stop_sequences(oai: openai.AsyncOpenAI) -> None:
    plain = await oai.chat.completions.create(model=CHAT_MODEL, messages=SAY_OK, max_tokens=64, temperature=0)
    answer = plain.choices[0].message.content
    assert plain.usage is not None
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens <= 48  # the premise
    floor = plain.usage.completion_tokens + 8
    assert answer is not None
    stop = answer[:2]  # a stop sequence at the very start of the answer: alone, it would leave nothing
    reply = await oai.chat.completions.create(
        model=CHAT_MODEL,
        messages=SAY_OK,
        max_tokens=64,
        temperature=0,
        stop=[stop],
        extra_body={"min_tokens": floor},
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens >= floor
    assert reply.choices[0].message.content is not None
    assert reply.choices[0].message.content.startswith(answer)  # the early stop text did not count
    stream = await oai.chat.completions.create(
        model=CHAT_MODEL, messages=SAY_OK, max_tokens=64, temperature=0.8, seed=3, stream=True,
        stream_options={"include_usage": True}, extra_body={"min_tokens": floor},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= floor
