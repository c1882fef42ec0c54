"""Text completions through the official openai SDK against the real SmolLM2 GGUF."""

from __future__ import annotations

from typing import Any, cast

import openai
import pytest
from openai import AsyncStream
from openai.types import Completion, CompletionUsage

from tests.conftest import CHAT_MODEL

PROMPT = "The three primary colors are"


async def greedy(oai: openai.AsyncOpenAI, prompt: Any, **extra: Any) -> openai.types.Completion:
    return await oai.completions.create(model=CHAT_MODEL, prompt=prompt, max_tokens=10, temperature=0, **extra)


async def test_string_prompt(oai: openai.AsyncOpenAI, vocab) -> None:
    reply = await greedy(oai, PROMPT)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and choice.index == 0
    assert choice.text.strip() and choice.finish_reason in {"stop", "length"}
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(vocab.tokenize(PROMPT.encode(), add_bos=False))
    assert reply.usage.completion_tokens <= 10


async def test_list_of_prompts_gives_one_choice_each_in_order(oai: openai.AsyncOpenAI) -> None:
    prompts = [PROMPT, "1, 2, 3, 4,"]
    together = await greedy(oai, prompts)
    alone = [await greedy(oai, p) for p in prompts]
    assert [c.index for c in together.choices] == [0, 1]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert together.usage is not None
    # cast: the server always reports usage (the SDK's type allows none).
    assert together.usage.prompt_tokens == sum(cast(CompletionUsage, a.usage).prompt_tokens for a in alone)


async def test_token_id_prompt_equals_text_prompt(oai: openai.AsyncOpenAI, vocab) -> None:
    ids = vocab.tokenize(PROMPT.encode(), add_bos=False)
    by_ids = await greedy(oai, ids)
    by_text = await greedy(oai, PROMPT)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = await greedy(oai, [ids, ids])
    assert [c.text for c in batch.choices] == [by_text.choices[0].text] * 2


async def test_generated_token_logprobs(oai: openai.AsyncOpenAI) -> None:
    reply = await greedy(oai, PROMPT, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert reply.usage is not None
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == reply.usage.completion_tokens
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the chosen token is the best
        assert token in top
    offsets = logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[0] == 0


async def test_stream_matches_non_stream(oai: openai.AsyncOpenAI) -> None:
    whole = await greedy(oai, [PROMPT, "Once upon a time"])
    # cast: with stream=True the helper hands back the SDK's stream.
    stream = cast(
        AsyncStream[Completion],
        await greedy(oai, [PROMPT, "Once upon a time"], stream=True, stream_options={"include_usage": True}),
    )
    texts = {0: "", 1: ""}
    usage = None
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
        usage = chunk.usage or usage
    assert [texts[0], texts[1]] == [c.text for c in whole.choices]
    assert whole.usage is not None
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens


async def test_sampling_fields_and_seed(oai: openai.AsyncOpenAI) -> None:
    kwargs: dict[str, Any] = {"temperature": 0.9, "top_p": 0.8, "seed": 7, "max_tokens": 16}
    a = await oai.completions.create(model=CHAT_MODEL, prompt="My favourite animal is", **kwargs)
    b = await oai.completions.create(model=CHAT_MODEL, prompt="My favourite animal is", **kwargs)
    assert a.choices[0].text == b.choices[0].text


async def test_stop_sequences(oai: openai.AsyncOpenAI) -> None:
    # ignore_eos: all 10 tokens, whatever this machine's llama.cpp decodes; the stop is cut
    # from this run's own text, so it surely occurs.
    free = await greedy(oai, "1, 2, 3, 4,", extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[len(text) // 2 :][:2]
    assert len(stop) == 2, text
    stopped = await greedy(oai, "1, 2, 3, 4,", stop=stop, extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


async def test_echo_returns_prompt_first(oai: openai.AsyncOpenAI) -> None:
    reply = await greedy(oai, PROMPT, echo=True)
    plain = await greedy(oai, PROMPT)
    assert reply.choices[0].text == PROMPT + plain.choices[0].text


async def test_empty_prompt_starts_from_the_beginning_of_text(oai: openai.AsyncOpenAI) -> None:
    reply = await greedy(oai, "")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == 1  # the BOS token
    assert reply.choices[0].finish_reason in {"stop", "length"}
    batch = await greedy(oai, ["", "x"])
    assert len(batch.choices) == 2
