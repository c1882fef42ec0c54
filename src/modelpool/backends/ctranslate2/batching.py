"""Which waiting requests run together in one CTranslate2 `generate_batch` call.

CT2 applies its decoding options to a whole batch (temperature, top-k/p, repetition
penalty, minimum length, end tokens, what it returns), so only requests that agree on them
share a batch: they share a `BatchKey`. And CT2 forwards the prompts of a batch at once
only up to the shortest one; a longer prompt's rest is fed one token per decode step, which
delays that request's first token by a step per extra token and, in int8, changes its
numbers a little (a greedy answer may differ from the same request run alone). So a batch
also keeps its prompt lengths within `spread` tokens of each other (0: equal lengths only,
every greedy answer then equals the one it gets alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from modelpool.inference import SamplingParams


@dataclass(frozen=True)
class BatchKey:
    """The decoding options CT2 takes per batch, normalised so equal behaviour is equal keys."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    min_tokens: int
    ignore_eos: bool
    logprobs: bool
    """Rows want their tokens' log-probabilities (CT2's `return_scores`)."""
    top_logprobs: bool
    """Rows want alternatives too: the whole distribution of every step (`return_logits_vocab`)."""
    beam_size: int = 1
    """CT2's own beam search with this many beams (1: token by token, streamed)."""
    length_penalty: float = 1.0
    beam_length: int = 0
    """A beam row's `max_length`: which hypothesis wins depends on it, so beam rows share a
    batch only with rows of the same cap (0 for other rows: each stops itself)."""


def batch_key(params: SamplingParams, max_new: int = 0) -> BatchKey:
    greedy = params.temperature == 0 or params.top_k == 1
    beam = params.beam
    return BatchKey(
        greedy=greedy,
        temperature=1.0 if greedy else params.temperature,
        top_k=1 if greedy else params.top_k,
        top_p=1.0 if greedy else params.top_p,
        repetition_penalty=params.repetition_penalty,
        min_tokens=0 if params.ignore_eos else params.min_tokens,
        ignore_eos=params.ignore_eos,
        logprobs=params.logprobs is not None,
        top_logprobs=bool(params.logprobs),
        beam_size=beam.width if beam is not None else 1,
        length_penalty=beam.length_penalty if beam is not None else 1.0,
        beam_length=max_new if beam is not None else 0,
    )


class Waiting(Protocol):
    """What batching reads of a waiting request."""

    @property
    def key(self) -> BatchKey: ...

    @property
    def prompt_length(self) -> int: ...


W = TypeVar("W", bound=Waiting)


def take_batch(waiting: list[W], max_size: int, spread: int, alive: Callable[[W], bool]) -> list[W]:
    """The next batch, taken out of `waiting` (oldest first): the oldest live request and,
    in arrival order, every later one with its key whose prompt keeps the batch's lengths
    within `spread`, up to `max_size`. Requests that are no longer `alive` are dropped."""
    waiting[:] = [w for w in waiting if alive(w)]
    if not waiting:
        return []
    head = waiting[0]
    batch, shortest, longest = [head], head.prompt_length, head.prompt_length
    for candidate in waiting[1:]:
        if len(batch) >= max_size:
            break
        length = candidate.prompt_length
        if candidate.key == head.key and max(longest, length) - min(shortest, length) <= spread:
            batch.append(candidate)
            shortest, longest = min(shortest, length), max(longest, length)
    taken = {id(w) for w in batch}
    waiting[:] = [w for w in waiting if id(w) not in taken]
    return batch


def longest_wanted(lengths: Iterable[int]) -> int:
    """CT2's `max_length` for a batch: the most any row may generate (each row stops itself)."""
    return max(lengths, default=1)
