"""Generations as the API sees them: the timing a stream of chunks feeds, and the
non-streaming assembly of a whole generation from its stream (the one generation path)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from modelpool.inference import GenerationChunk, TokenLogprob, ToolCall, ToolCallDelta, Usage
from modelpool.runtime.clock import Clock
from modelpool.runtime.timing import RequestTiming
from modelpool.tools.calls import assemble_calls

ChoiceChunk = tuple[int, GenerationChunk]
"""A chunk of one choice (one prompt of a multi-prompt completion), by its index."""


def chunk_timer(
    timing: RequestTiming, clock: Clock, counted: Callable[[], None] | None = None
) -> Callable[[GenerationChunk], None]:
    """Feeds `timing` from the chunks of one generation at a time as they pass: time to
    first token, and token counts (summed over the generations of a multi-prompt request)
    as soon as they are known: the prompt's from the chunk that says it (a local engine's
    first, at admission), the output's chunk by chunk (`token_count`), both set right by the
    generation's last chunk (its `usage`, the count to rely on). `counted()` runs after
    each change, so a generation cut off midway (a client that hung up, a cancelled
    request) has its tokens so far counted. Concurrent generations need a timer each."""
    prompt_seen = output_seen = 0  # of the generation in progress, before its usage came

    def observe(chunk: GenerationChunk) -> None:
        nonlocal prompt_seen, output_seen
        if (chunk.text or chunk.tool_calls) and timing.time_to_first_token_s is None:
            timing.time_to_first_token_s = clock.monotonic() - timing.started
        if chunk.usage is not None:  # the generation's own count replaces what its chunks said
            more_prompt = chunk.usage.prompt_tokens - prompt_seen
            more_output = chunk.usage.completion_tokens - output_seen
            prompt_seen = output_seen = 0  # the next generation (multi-prompt) starts afresh
        else:
            more_prompt = chunk.prompt_tokens if chunk.prompt_tokens and not prompt_seen else 0
            more_output = chunk.token_count
            prompt_seen += more_prompt
            output_seen += more_output
        if more_prompt or more_output:
            timing.prompt_tokens += more_prompt
            timing.output_tokens += more_output
            if counted is not None:
                counted()

    return observe


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
