"""The one order a chat's output goes through on its way out of an engine.

1. Stop sequences are matched on the raw generated text, inside the sequence
   (`sequence.TextSequence`): a stop must end the generation at once, on the engine
   thread, so it cannot wait for the stages below; the text it releases is already trimmed.
2. Reasoning (`<think>…</think>`) is split from the answer (`reasoning`).
3. Tool calls are parsed from the answer only (`tools.stream`): a call written while the
   model reasons stays reasoning.

Backends that run no kit engine (managed engine servers, remote upstreams) apply stage 2
themselves, with `split_reasoning`."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import replace

from modelpool.backends.textgen.reasoning import ReasoningMode, split_reasoning
from modelpool.inference import GenerationChunk
from modelpool.tools.parsers import ToolCallParser
from modelpool.tools.stream import with_tool_calls


def chat_output(
    chunks: AsyncGenerator[GenerationChunk, None],
    *,
    reasoning: ReasoningMode | None,
    tools: ToolCallParser | None,
    prompt_seconds: float | None = None,
) -> AsyncGenerator[GenerationChunk, None]:
    """`chunks` (stop-trimmed by their sequence) with reasoning split off, then tool calls
    parsed; `prompt_seconds` (the prompt's rendering and tokenizing, `prompt_clock`) told on
    the chunk that says the prompt's size."""
    if prompt_seconds is not None:
        chunks = _with_prompt_seconds(chunks, prompt_seconds)
    if reasoning is not None:
        chunks = split_reasoning(chunks, reasoning)
    if tools is not None:
        chunks = with_tool_calls(chunks, tools)
    return chunks


def prompt_clock() -> float:
    """Now, to time a prompt's rendering and tokenizing: `prompt_clock() - started`."""
    return time.monotonic()


async def _with_prompt_seconds(
    chunks: AsyncGenerator[GenerationChunk, None], seconds: float
) -> AsyncGenerator[GenerationChunk, None]:
    told = False
    async for chunk in chunks:
        if not told and chunk.prompt_tokens is not None:
            chunk, told = replace(chunk, prompt_seconds=seconds), True
        yield chunk
