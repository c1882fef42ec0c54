"""A running generation as the API sees it, and its non-streaming assembly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from modelpool.backends.base import GenerationChunk, TokenLogprob, Usage


class GenerationStream:
    """Chunks of one generation, holding the model's turn until closed.

    `aclose()` is idempotent and also works on a stream nobody started iterating, so the
    turn is always given back (an abandoned async generator would never run its finally).
    """

    def __init__(
        self,
        model_id: str,
        chunks: AsyncIterator[GenerationChunk],
        release: Callable[[], None],
        on_usage: Callable[[Usage], None],
    ) -> None:
        self.model_id = model_id
        self._chunks = chunks
        self._release = release
        self._on_usage = on_usage
        self._closed = False
        self._first: GenerationChunk | None = None

    async def prefetch(self) -> None:
        """Run the generation up to its first chunk, so that problems with the request itself
        (prompt too long, bad template) raise here, before any response has started."""
        with contextlib.suppress(StopAsyncIteration):  # an empty generation closes itself
            self._first = await self.__anext__()

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._closed:
            raise StopAsyncIteration
        try:
            chunk = await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise
        if chunk.usage is not None:
            self._on_usage(chunk.usage)
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._release()


@dataclass(frozen=True)
class Generation:
    text: str
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str
    usage: Usage


async def collect(stream: AsyncIterator[GenerationChunk]) -> Generation:
    """Assemble a whole generation from its stream (the one generation path)."""
    texts: list[str] = []
    logprobs: list[TokenLogprob] = []
    finish_reason, usage = "stop", Usage(0, 0)
    async for chunk in stream:
        texts.append(chunk.text)
        logprobs.extend(chunk.logprobs)
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    return Generation("".join(texts), tuple(logprobs), finish_reason, usage)
