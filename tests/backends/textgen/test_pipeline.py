"""A chat's output pipeline: reasoning is split off first, then tool calls are read from
the answer alone."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator

from modelpool.backends.textgen.pipeline import chat_output
from modelpool.inference import GenerationChunk, ToolCall, Usage
from modelpool.tools.calls import assemble_calls
from modelpool.tools.parsers import make_parser

USAGE = Usage(prompt_tokens=12, completion_tokens=30)
CALL = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "\n</tool_call>"]


async def stream(*pieces: str) -> AsyncGenerator[GenerationChunk, None]:
    yield GenerationChunk()
    for piece in pieces:
        yield GenerationChunk(text=piece)
    yield GenerationChunk(finish_reason="stop", usage=USAGE)


async def read(*pieces: str) -> list[GenerationChunk]:
    counter = itertools.count()
    parser = make_parser("hermes", live=True, new_id=lambda: f"call_{next(counter)}")
    return [chunk async for chunk in chat_output(stream(*pieces), reasoning="think", tools=parser)]


async def test_a_call_written_while_reasoning_stays_reasoning() -> None:
    out = await read("<th", "ink>I could call ", *CALL, " but I know it.</think>", "It is sunny.")
    assert not any(chunk.tool_calls for chunk in out)
    assert "".join(c.reasoning for c in out) == "I could call " + "".join(CALL) + " but I know it."
    assert "".join(c.text for c in out) == "It is sunny."
    assert out[-1].finish_reason == "stop"


async def test_a_call_after_the_reasoning_is_a_call() -> None:
    out = await read("<think>Paris weather: ask the tool.</think>", *CALL)
    assert "".join(c.reasoning for c in out) == "Paris weather: ask the tool."
    assert assemble_calls(d for c in out for d in c.tool_calls) == (
        ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
    )
    assert "".join(c.text for c in out) == ""
    assert out[-1].finish_reason == "tool_calls"
    assert out[-1].usage == USAGE


async def test_without_reasoning_or_tools_the_chunks_pass_unchanged() -> None:
    out = [c async for c in chat_output(stream("a", "<think>b"), reasoning=None, tools=None)]
    assert [c.text for c in out] == ["", "a", "<think>b", ""]
