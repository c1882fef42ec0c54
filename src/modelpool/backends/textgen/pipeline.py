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

from collections.abc import AsyncGenerator

from modelpool.backends.textgen.reasoning import ReasoningMode, split_reasoning
from modelpool.inference import GenerationChunk
from modelpool.tools.parsers import ToolCallParser
from modelpool.tools.stream import with_tool_calls


def chat_output(
    chunks: AsyncGenerator[GenerationChunk, None], *, reasoning: ReasoningMode | None, tools: ToolCallParser | None
) -> AsyncGenerator[GenerationChunk, None]:
    """`chunks` (stop-trimmed by their sequence) with reasoning split off, then tool calls parsed."""
    if reasoning is not None:
        chunks = split_reasoning(chunks, reasoning)
    if tools is not None:
        chunks = with_tool_calls(chunks, tools)
    return chunks
