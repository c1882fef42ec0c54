"""Channel: an engine thread's items reach the event loop in runs — the first at once, the
ones that pile up while the consumer is busy together, in one wakeup."""

from __future__ import annotations

import asyncio
import threading

import pytest

from modelpool.backends.textgen.channel import Channel, chunk_stream, merge_chunks
from modelpool.inference import GenerationChunk, TokenLogprob, ToolCallDelta, Usage


async def test_the_first_item_crosses_at_once_and_a_backlog_crosses_as_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    wakeups = 0
    call_soon_threadsafe = loop.call_soon_threadsafe

    channel: Channel[int] = Channel(loop)

    def counted(*args: object) -> object:
        # This channel's wakeups only: the session's loop also hears from other tests' threads.
        nonlocal wakeups
        wakeups += getattr(args[0], "__self__", None) is channel._ready
        return call_soon_threadsafe(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    runs = channel.runs()
    threading.Thread(target=channel.put, args=(1,)).start()
    assert await asyncio.wait_for(anext(runs), 5) == [1]
    # The consumer is "busy" (not awaiting) while the producer puts three more.
    def produce() -> None:
        for i in (2, 3, 4):
            channel.put(i)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    assert await asyncio.wait_for(anext(runs), 5) == [2, 3, 4]
    assert wakeups == 2  # one for the first item, one for the whole backlog
    channel.end()
    with pytest.raises(StopAsyncIteration):
        await anext(runs)


async def test_an_error_arrives_after_the_items_before_it() -> None:
    channel: Channel[int] = Channel(asyncio.get_running_loop())
    channel.put(1)
    channel.end(ValueError("engine failed"))
    received = []
    with pytest.raises(ValueError, match="engine failed"):
        async for run in channel.runs():
            received.extend(run)
    assert received == [1]


async def test_a_consumer_that_leaves_cancels_the_producer() -> None:
    channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
    channel.put(GenerationChunk("a"))
    stream = chunk_stream(channel)
    assert (await anext(stream)).text == "a"
    assert not channel.cancelled.is_set()
    await stream.aclose()
    assert channel.cancelled.is_set()


async def test_a_closed_loop_cancels_instead_of_raising_in_the_producer() -> None:
    loop = asyncio.new_event_loop()
    channel: Channel[int] = Channel(loop)
    loop.close()
    channel.put(1)  # the engine thread must not crash because the server is gone
    assert channel.cancelled.is_set()


def test_text_merges_and_the_final_chunk_absorbs_the_text_before_it() -> None:
    first = TokenLogprob("a", -0.1, (97,))
    second = TokenLogprob("b", -0.2, (98,))
    merged = merge_chunks([
        GenerationChunk("a", (first,)),
        GenerationChunk("b", (second,)),
        GenerationChunk("", finish_reason="stop", usage=Usage(3, 2)),
    ])  # fmt: skip
    assert merged == [GenerationChunk("ab", (first, second), finish_reason="stop", usage=Usage(3, 2))]


def test_tool_call_pieces_and_reasoning_keep_their_own_chunks() -> None:
    call = GenerationChunk(tool_calls=(ToolCallDelta(0, "call_1", "add"),))
    thought = GenerationChunk(reasoning="hmm")
    assert merge_chunks([GenerationChunk("x"), call, GenerationChunk("y")]) == [
        GenerationChunk("x"), call, GenerationChunk("y")
    ]  # fmt: skip
    assert merge_chunks([thought, GenerationChunk("z")]) == [thought, GenerationChunk("z")]


def test_merging_keeps_the_first_chunks_prompt_count() -> None:
    """The admission chunk's prompt count survives being merged with the text after it."""
    merged = merge_chunks([GenerationChunk(prompt_tokens=12), GenerationChunk("a"), GenerationChunk("b")])
    assert [(c.text, c.prompt_tokens) for c in merged] == [("ab", 12)]
