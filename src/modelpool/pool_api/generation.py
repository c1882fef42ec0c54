"""Generations as the API sees them: the non-streaming assembly of a whole generation from
its stream (the one generation path)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from modelpool.inference import GenerationChunk, TokenLogprob, ToolCall, ToolCallDelta, Usage
from modelpool.tools.calls import assemble_calls

ChoiceChunk = tuple[int, GenerationChunk]
"""A chunk of one choice (one prompt of a multi-prompt completion), by its index."""


@dataclass(frozen=True)
class Generation:
    text: str
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str
    usage: Usage
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_sequence: str | None = None
    """The stop sequence that ended it, when the engine says (see GenerationChunk)."""


async def collect(stream: AsyncIterator[GenerationChunk]) -> Generation:
    """Assemble a whole generation from its stream (tool calls from their streamed pieces,
    so a whole reply holds exactly what its stream would have)."""
    texts: list[str] = []
    reasoning: list[str] = []
    logprobs: list[TokenLogprob] = []
    calls: list[ToolCallDelta] = []
    finish_reason, usage, stop = "stop", Usage(0, 0), None
    async for chunk in stream:
        texts.append(chunk.text)
        reasoning.append(chunk.reasoning)
        logprobs.extend(chunk.logprobs)
        calls.extend(chunk.tool_calls)
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
        stop = chunk.stop_sequence or stop
    text = "".join(texts)
    return Generation(text, tuple(logprobs), finish_reason, usage, "".join(reasoning), assemble_calls(calls), stop)


async def collect_choices(stream: AsyncIterator[ChoiceChunk]) -> list[Generation]:
    """Assemble every choice of a multi-prompt stream, in index order."""
    pieces: dict[int, list[GenerationChunk]] = {}
    async for index, chunk in stream:
        pieces.setdefault(index, []).append(chunk)
    return [await collect(_replay(pieces[index])) for index in sorted(pieces)]


async def _replay(chunks: list[GenerationChunk]) -> AsyncGenerator[GenerationChunk, None]:
    for chunk in chunks:
        yield chunk
