"""A running generation as the API sees it, and its non-streaming assembly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from modelpool.backends.base import GenerationChunk, TokenLogprob, Usage
from modelpool.errors import ModelUnloaded
from modelpool.runtime.clock import Clock
from modelpool.runtime.replica import Lease
from modelpool.runtime.timing import RequestTiming


class GenerationStream:
    """Chunks of one generation, holding the model's turn until closed.

    `aclose()` is idempotent and also works on a stream nobody started iterating, so the
    turn is always given back (an abandoned async generator would never run its finally).
    A forced unload revokes the lease: the stream then stops at its next chunk.
    """

    def __init__(
        self,
        chunks: AsyncIterator[GenerationChunk],
        lease: Lease,
        clock: Clock,
        on_done: Callable[[RequestTiming], None],
        *,
        owns_lease: bool = True,
    ) -> None:
        """`owns_lease`: closing the stream releases the lease. A request that runs several
        generations on one lease (multi-prompt completions) releases it itself."""
        self.model_id = lease.model_id
        self.timing = (
            lease.timing if owns_lease else RequestTiming(replica=lease.replica.index, started=clock.monotonic())
        )
        self._owns_lease = owns_lease
        self._chunks = chunks
        self._lease = lease
        self._clock = clock
        self._on_done = on_done
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
        if self._lease.revoked:
            await self.aclose()
            raise ModelUnloaded(f"model '{self.model_id}' was unloaded while this request ran")
        try:
            chunk = await self._chunks.__anext__()
        except BaseException:
            await self.aclose()
            raise
        self._observe(chunk)
        return chunk

    def _observe(self, chunk: GenerationChunk) -> None:
        timing = self.timing
        if chunk.text and timing.time_to_first_token_s is None:
            timing.time_to_first_token_s = self._clock.monotonic() - timing.started
        if chunk.usage is not None:
            timing.prompt_tokens = chunk.usage.prompt_tokens
            timing.output_tokens = chunk.usage.completion_tokens
            timing.backend_s = self._clock.monotonic() - timing.started

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            if not self.timing.backend_s:
                self.timing.backend_s = self._clock.monotonic() - self.timing.started
            if self._owns_lease:
                self._lease.release()
            self._on_done(self.timing)


@dataclass(frozen=True)
class Generation:
    text: str
    logprobs: tuple[TokenLogprob, ...]
    finish_reason: str
    usage: Usage
    reasoning: str = ""


async def collect(stream: AsyncIterator[GenerationChunk]) -> Generation:
    """Assemble a whole generation from its stream (the one generation path)."""
    texts: list[str] = []
    reasoning: list[str] = []
    logprobs: list[TokenLogprob] = []
    finish_reason, usage = "stop", Usage(0, 0)
    async for chunk in stream:
        texts.append(chunk.text)
        reasoning.append(chunk.reasoning)
        logprobs.extend(chunk.logprobs)
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    return Generation("".join(texts), tuple(logprobs), finish_reason, usage, "".join(reasoning))
