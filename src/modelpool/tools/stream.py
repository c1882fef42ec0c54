"""Tool calls in a stream of generation chunks."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

from modelpool.inference import GenerationChunk
from modelpool.tools.calls import merge_deltas
from modelpool.tools.parsers import Parsed, ToolCallParser


async def with_tool_calls(
    chunks: AsyncGenerator[GenerationChunk, None], parser: ToolCallParser
) -> AsyncGenerator[GenerationChunk, None]:
    """`chunks` with their text read by `parser`: each chunk carries the content and call
    pieces its text released; the last one (with a finish reason) also what was held back,
    and finishes with "tool_calls" instead of "stop" when any call was made. A chunk left
    with nothing in it is dropped, except the first: backends yield an empty first chunk to
    say the request was accepted."""
    first = True
    called = False
    finished = False
    unsent = 0  # tokens of dropped chunks: the next chunk out counts them
    async for chunk in chunks:
        parsed = parser.feed(chunk.text)
        finish_reason = chunk.finish_reason
        if finish_reason is not None:
            finished = True
            parsed = _joined(parsed, parser.finish())
        called = called or bool(parsed.calls)
        if finish_reason == "stop" and called:
            finish_reason = "tool_calls"
        out = replace(chunk, text=parsed.content, tool_calls=parsed.calls, finish_reason=finish_reason,
                      token_count=unsent + chunk.token_count)  # fmt: skip
        if first or _carries_anything(out):
            unsent = 0
            yield out
        else:
            unsent = out.token_count
        first = False
    if not finished:
        # A stream cut off without a finish reason still gets what the parser held back.
        tail = parser.finish()
        if tail.content or tail.calls or unsent:
            yield GenerationChunk(text=tail.content, tool_calls=tail.calls, token_count=unsent)


def _joined(a: Parsed, b: Parsed) -> Parsed:
    return Parsed(a.content + b.content, merge_deltas(a.calls + b.calls))


def _carries_anything(chunk: GenerationChunk) -> bool:
    return bool(
        chunk.text
        or chunk.tool_calls
        or chunk.logprobs
        or chunk.reasoning
        or chunk.finish_reason is not None
        or chunk.usage is not None
    )
