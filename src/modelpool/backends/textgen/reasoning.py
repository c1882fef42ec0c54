"""Reasoning models: text between <think> and </think> is reasoning, returned apart from
the answer (`reasoning_content`). `think`: the model opens the tag itself; `think_open`:
the chat template opens it (the output starts inside the reasoning), as DeepSeek-R1's does.
Tags split across tokens are held back until they are whole, as stop sequences are."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Literal

from modelpool.inference import GenerationChunk

OPEN, CLOSE = "<think>", "</think>"
ReasoningMode = Literal["think", "think_open"]


class ReasoningSplitter:
    def __init__(self, *, starts_inside: bool) -> None:
        self.inside = starts_inside
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) released by this piece of text."""
        buffer = self._held + text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            tag = CLOSE if self.inside else OPEN
            found = buffer.find(tag)
            if found < 0:
                keep = _partial_tag_length(buffer, tag)
                released, self._held = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
                (reasoning if self.inside else content).append(released)
                return "".join(reasoning), "".join(content)
            (reasoning if self.inside else content).append(buffer[:found])
            buffer = buffer[found + len(tag) :]
            self.inside = not self.inside

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self.inside else ("", held)


async def split_reasoning(
    chunks: AsyncGenerator[GenerationChunk, None], mode: ReasoningMode
) -> AsyncGenerator[GenerationChunk, None]:
    """Each chunk's text as (reasoning, content); the finishing chunk also gets what was held back."""
    splitter = ReasoningSplitter(starts_inside=mode == "think_open")
    async for chunk in chunks:
        reasoning, content = splitter.feed(chunk.text)
        if chunk.finish_reason is not None:
            tail_reasoning, tail_content = splitter.flush()
            reasoning, content = reasoning + tail_reasoning, content + tail_content
        yield replace(chunk, text=content, reasoning=reasoning)


def _partial_tag_length(buffer: str, tag: str) -> int:
    for length in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:length]):
            return length
    return 0
