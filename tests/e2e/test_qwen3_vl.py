"""Qwen3-VL in the transformers backend, through the official openai SDK: a tiny
random-weight model (tests/vlm_models.py) whose answers equal plain transformers'
`generate` token for token and log-probability for log-probability, alone and decoding in
a batch with others (its interleaved M-RoPE gives an image fewer positions than tokens, and
DeepStack adds the image's features into the first text layer during the prefill)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.conftest import sdk, serving
from tests.e2e.test_vision import QUESTION, ask, data_uri, direct_logprobs, png, vlm_config
from tests.vlm_models import tiny_qwen3_vl

QWEN3 = "tiny-qwen3-vl"


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[httpx.AsyncClient]:
    models = {QWEN3: {**vlm_config(tiny_qwen3_vl()), "preload": True}}
    async with serving({"starter_models": False, "models": models}) as (_, http):
        yield http


async def scored(client: httpx.AsyncClient, messages: list[ChatCompletionMessageParam]) -> ChatCompletion:
    return await sdk(client).chat.completions.create(
        model=QWEN3, messages=messages, max_tokens=6, temperature=0, logprobs=True
    )


def logprobs_of(reply: ChatCompletion) -> list[float]:
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
    return [entry.logprob for entry in reply.choices[0].logprobs.content]


async def test_qwen3_vl_images_match_plain_transformers_alone_and_in_a_batch(client: httpx.AsyncClient) -> None:
    colors = ("red", "blue")
    alone = [await scored(client, ask(data_uri(png(c)))) for c in colors]
    assert alone[0].choices[0].message.content != alone[1].choices[0].message.content
    batched = await asyncio.gather(*(scored(client, ask(data_uri(png(c)))) for c in colors),
                                   scored(client, [{"role": "user", "content": QUESTION}]))  # fmt: skip
    for color, one, together in zip(colors, alone, batched, strict=False):
        expected = direct_logprobs(tiny_qwen3_vl(), color, 6)
        assert logprobs_of(one) == pytest.approx(expected, abs=1e-4), color
        assert logprobs_of(together) == pytest.approx(expected, abs=1e-4), color
