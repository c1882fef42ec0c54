"""Tool calls read out of a stream of generation chunks."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator

from modelpool.inference import GenerationChunk, TokenLogprob, ToolCall, ToolCallDelta, Usage
from modelpool.tools.calls import assemble_calls
from modelpool.tools.parsers import make_parser
from modelpool.tools.stream import with_tool_calls

USAGE = Usage(prompt_tokens=31, completion_tokens=24)


async def stream(*chunks: GenerationChunk) -> AsyncGenerator[GenerationChunk, None]:
    for chunk in chunks:
        yield chunk


async def read(family: str, *chunks: GenerationChunk, live: bool = True) -> list[GenerationChunk]:
    counter = itertools.count()
    parser = make_parser(family, live=live, new_id=lambda: f"call_{next(counter)}")
    return [chunk async for chunk in with_tool_calls(stream(*chunks), parser)]


def texts(*pieces: str, finish_reason: str = "stop") -> list[GenerationChunk]:
    """An accepted-request chunk, `pieces`, and a last chunk with usage."""
    return [
        GenerationChunk(),
        *(GenerationChunk(text=piece) for piece in pieces),
        GenerationChunk(finish_reason=finish_reason, usage=USAGE),
    ]


QWEN = ["<tool_call>", "\n", '{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}', "\n", "</tool_call>"]


async def test_a_call_finishes_with_tool_calls() -> None:
    out = await read("hermes", *texts(*QWEN))
    assert out[0] == GenerationChunk()  # passed through although empty: the request was accepted
    assert all(chunk.text == "" for chunk in out)
    assert assemble_calls(d for chunk in out for d in chunk.tool_calls) == (
        ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
    )
    assert out[-1].finish_reason == "tool_calls"
    assert out[-1].usage == USAGE
    assert [chunk.finish_reason for chunk in out[:-1]] == [None] * (len(out) - 1)
    # Live: the name is out with the arguments' first piece, before the call is complete.
    assert out[1].tool_calls == (ToolCallDelta(0, "call_0", "get_weather", '{"city": '),)


async def test_chunks_left_empty_are_dropped() -> None:
    out = await read("hermes", *texts(*QWEN))
    # "<tool_call>", "\n", '{"name": "get_weather", ' and the last two pieces release nothing.
    assert [chunk.tool_calls for chunk in out] == [
        (),
        (ToolCallDelta(0, "call_0", "get_weather", '{"city": '),),
        (ToolCallDelta(0, arguments='"Paris"}'),),
        (),
    ]


async def test_whole_call_mode_emits_the_call_when_its_block_closes() -> None:
    out = await read("hermes", *texts(*QWEN), live=False)
    assert [chunk.tool_calls for chunk in out] == [
        (),
        (ToolCallDelta(0, "call_0", "get_weather", '{"city": "Paris"}'),),
        (),
    ]
    assert out[-1].finish_reason == "tool_calls"


async def test_a_cut_call_keeps_length() -> None:
    out = await read("hermes", *texts(*QWEN[:4], finish_reason="length"))
    assert out[-1].finish_reason == "length"
    assert assemble_calls(d for chunk in out for d in chunk.tool_calls) == (
        ToolCall("call_0", "get_weather", '{"city": '),
    )


async def test_a_broken_call_at_length_is_content() -> None:
    out = await read("hermes", *texts(*QWEN[:4], finish_reason="length"), live=False)
    assert "".join(chunk.text for chunk in out) == "".join(QWEN[:4])
    assert out[-1] == GenerationChunk(text="".join(QWEN[:4]), finish_reason="length", usage=USAGE)


async def test_plain_chunks_pass_unchanged() -> None:
    logprob = TokenLogprob(token=" Paris", logprob=-0.01, bytes=tuple(b" Paris"))
    chunks = [
        GenerationChunk(),
        GenerationChunk(text="The capital", reasoning=""),
        GenerationChunk(text=" of France is", logprobs=(logprob,)),
        GenerationChunk(reasoning="The user asks about France."),
        GenerationChunk(text=" Paris.", finish_reason="stop", usage=USAGE),
    ]
    for family in ("hermes", "llama3_json", "mistral", "generic"):
        assert await read(family, *chunks) == chunks


async def test_held_text_is_released_with_the_last_chunk() -> None:
    out = await read("mistral", *texts("Brackets: ", "[TOOL_", "C"))
    assert [chunk.text for chunk in out] == ["", "Brackets: ", "[TOOL_C"]  # "[TOOL_C" may still be a marker
    assert out[-1].finish_reason == "stop"


async def test_a_chunk_whose_text_is_held_keeps_its_logprobs() -> None:
    logprob = TokenLogprob(token="<tool_", logprob=-2.0, bytes=tuple(b"<tool_"))
    chunks = [GenerationChunk(), GenerationChunk(text="<tool_", logprobs=(logprob,)), GenerationChunk(text="box>")]
    out = await read("hermes", *chunks, GenerationChunk(finish_reason="stop"))
    assert out[1] == GenerationChunk(text="", logprobs=(logprob,))
    assert [chunk.text for chunk in out] == ["", "", "<tool_box>", ""]


async def test_text_before_a_call_is_content() -> None:
    chunks = texts("Let me check.", "\n\n[TOOL_CALLS]", "get_weather[ARGS]", '{"city": "Paris"}')
    out = await read("mistral", *chunks)
    assert "".join(chunk.text for chunk in out) == "Let me check.\n\n"
    assert assemble_calls(d for chunk in out for d in chunk.tool_calls) == (
        ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
    )
    assert out[-1].finish_reason == "tool_calls"


async def test_a_stream_without_a_finish_reason_still_gets_what_was_held() -> None:
    out = await read("hermes", GenerationChunk(), GenerationChunk(text="cut <tool_"))
    assert [chunk.text for chunk in out] == ["", "cut ", "<tool_"]


async def test_an_empty_stream() -> None:
    assert await read("generic") == []
