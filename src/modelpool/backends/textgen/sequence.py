"""One generation inside an engine's batch, the same for every engine: its tokens become
text (held back while it might be a stop sequence), logprob entries and chunks on its
output; it ends on an end token, a stop sequence, its grammar's end or its `max_tokens`,
and fails or leaves (cancellation) on its own.

The engine thread owns a sequence after submission. An engine hands it each token it
chose (`accept`) and says how that token's log-probability entry is made (`logprob`,
from logits it computed however it does); the sequence decides the rest."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Container
from typing import Protocol

from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.textgen.decoding import StopMatcher, may_end
from modelpool.inference import GenerationChunk, SamplingParams, Speculation, TokenLogprob, Usage
from modelpool.logs import current_request_id


class Output(Protocol):
    """Where a sequence's chunks go (a `Channel`), written on the engine thread."""

    @property
    def cancelled(self) -> threading.Event:
        """Set when the consumer has left: the sequence leaves the batch at the next step."""
        ...

    def put(self, item: GenerationChunk) -> None: ...

    def end(self, error: BaseException | None = None) -> None: ...


class Detokenizer(Protocol):
    """Token ids to text, released only once it is whole characters."""

    def add(self, token: int) -> str: ...

    def flush(self) -> str: ...


class TextSequence(ABC):
    def __init__(
        self,
        *,
        sampling: SamplingParams,
        max_new: int,
        output: Output,
        detok: Detokenizer,
        end_ids: Container[int],
        prompt_tokens: int,
        constraint: TokenConstraint | None = None,
    ) -> None:
        self.sampling = sampling
        self.max_new = max_new
        self.output = output
        self.detok = detok
        self.end_ids = end_ids
        """Tokens that end the generation (not counted, not shown)."""
        self.prompt_tokens = prompt_tokens
        self.constraint = constraint
        """The grammar this sequence's output must follow (its own: free and constrained
        sequences share the batch)."""
        self.generated = 0
        self.done = False
        self.request_id = current_request_id.get()
        """The request this sequence serves (made in its context), for the log and its errors."""
        self._reported = 0
        """Of `generated`, those a chunk has counted (`GenerationChunk.token_count`)."""
        self._pending: list[TokenLogprob] = []
        self._stops = StopMatcher(sampling.stop)

    @property
    def cancelled(self) -> bool:
        return self.output.cancelled.is_set()

    def may_end(self) -> bool:
        """Whether an end token may come now (engines mask them while it may not)."""
        return may_end(self.sampling, self.generated)

    @abstractmethod
    def logprob(self, token: int) -> TokenLogprob:
        """The entry of the token just chosen (asked only when the request wants logprobs):
        each engine says how, from whatever it computed the token with."""

    def speculation(self) -> Speculation | None:
        """What a draft model guessed for this sequence (None: no draft), on its last chunk."""
        return None

    def accept(self, token: int) -> bool:
        """Take the next generated token; True once the sequence has finished."""
        if token in self.end_ids:
            self.finish("stop", hit_stop=False)
            return True
        constraint = self.constraint
        if constraint is not None:
            constraint.advance(token)
        self.generated += 1
        if self.sampling.logprobs is not None:
            self._pending.append(self.logprob(token))
        text, hit_stop = self._stops.feed(self.detok.add(token), armed=self.generated >= self.sampling.min_tokens)
        if text or hit_stop:
            self.output.put(GenerationChunk(text, tuple(self._pending), token_count=self._unreported()))
            self._pending = []
        if hit_stop or (constraint is not None and constraint.complete):
            self.finish("stop", hit_stop=hit_stop)
        elif self.generated >= self.max_new:
            self.finish("length", hit_stop=False)
        return self.done

    def finish(self, reason: str, *, hit_stop: bool) -> None:
        """The last chunk, with what was held back for a stop sequence that never came."""
        if self.done:
            return
        tail = ""
        if not hit_stop:
            tail, hit_stop = self._stops.feed(self.detok.flush())
            tail += "" if hit_stop else self._stops.flush()
        usage = Usage(self.prompt_tokens, self.generated)
        # Done before the end crosses: whoever sees the end never counts this sequence in flight.
        self.done = True
        self.output.put(GenerationChunk(tail, tuple(self._pending), reason, usage, stop_sequence=self._stops.matched,
                                        token_count=self._unreported(), speculation=self.speculation()))  # fmt: skip
        self.output.end()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.done = True
            self.output.end(error)

    def _unreported(self) -> int:
        """The generated tokens no chunk has counted yet (the next chunk counts them)."""
        count, self._reported = self.generated - self._reported, self.generated
        return count
