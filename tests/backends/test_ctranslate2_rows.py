"""One request inside a CTranslate2 batch: what its tokens become (no engine: a word-piece
tokenizer and the real Channel)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from modelpool.backends.ctranslate2.rows import Row
from modelpool.backends.textgen.channel import Channel, chunk_stream
from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
from modelpool.inference import GenerationChunk, SamplingParams

PIECES = ["<end>", "Hello", " wor", "ld", "!", " How", " are", " you", "?"]
END = 0


class Pieces:
    """A tokenizer whose tokens are the pieces above; <end> decodes to nothing (special)."""

    def decode(self, ids: list[int], **_: object) -> str:
        return "".join(PIECES[i] for i in ids if i != END)


def row(channel: Channel[GenerationChunk], *, max_new: int = 20, **sampling: object) -> Row:
    params = SamplingParams(**sampling)  # type: ignore[arg-type]
    tokenizer = Pieces()
    return Row([1], params, max_new, channel, IncrementalDetokenizer(tokenizer, [1]), tokenizer, frozenset({END}))


async def received(channel: Channel[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in chunk_stream(channel)]


def text(chunks: list[GenerationChunk]) -> str:
    return "".join(c.text for c in chunks)


async def test_a_stop_string_split_across_tokens_never_leaks() -> None:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    r = row(channel, stop=("ld! H",))
    answers = [r.step(token, None, None) for token in (2, 3, 4, 5, 6)]
    assert answers == [False, False, False, True, True]  # done at " How", which completes the stop
    chunks = await received(channel)
    assert text(chunks) == " wor" and chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_the_row_ends_at_its_own_max_tokens_and_at_an_end_token() -> None:
    loop = asyncio.get_running_loop()
    capped: Channel[GenerationChunk] = Channel(loop)
    r = row(capped, max_new=2)
    assert [r.step(t, None, None) for t in (2, 3)] == [False, True]
    chunks = await received(capped)
    assert text(chunks) == " world" and chunks[-1].finish_reason == "length"
    ended: Channel[GenerationChunk] = Channel(loop)
    e = row(ended)
    assert [e.step(t, None, None) for t in (2, END)] == [False, True]
    chunks = await received(ended)
    assert text(chunks) == " wor" and chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 1  # the end token is not counted


async def test_a_stop_string_before_min_tokens_does_not_count() -> None:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    r = row(channel, stop=(" wor",), min_tokens=2)
    assert [r.step(t, None, None) for t in (2, 3, 5, 2)] == [False, False, False, True]
    chunks = await received(channel)
    assert text(chunks) == " world How" and chunks[-1].finish_reason == "stop"


async def test_a_row_whose_consumer_left_asks_ct2_to_stop_it() -> None:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    r = row(channel)
    assert r.step(2, None, None) is False
    channel.cancelled.set()
    assert r.step(3, None, None) is True
    assert r.done and not r.alive


async def test_logprobs_carry_the_chosen_token_and_the_top_alternatives() -> None:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    r = row(channel, logprobs=2, max_new=1)
    logits = np.zeros(len(PIECES), dtype=np.float32)
    logits[[2, 5, 7]] = [3.0, 2.0, 1.0]
    r.step(2, -0.5, logits)
    chunks = await received(channel)
    [entry] = [lp for c in chunks for lp in c.logprobs]
    assert (entry.token, entry.logprob, entry.token_id) == (" wor", -0.5, 2)
    expected = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert [t.token for t in entry.top] == [" wor", " How"]
    assert [t.logprob for t in entry.top] == pytest.approx([expected[2], expected[5]], abs=1e-9)
