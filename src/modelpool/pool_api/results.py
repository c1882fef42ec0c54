"""What the pool's requests return: `Outcome[T]` for every whole result (the value, its
timing and its usage), and the typed values and stream headers the interface names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from modelpool.errors import ModelpoolError, usage_carried
from modelpool.inference import ChatRequest, Segment, TokenPiece, Voice
from modelpool.pool_api.streams import ResultStream
from modelpool.pool_api.timing import RequestTiming
from modelpool.pool_api.usage import RequestUsage, UsageMeter

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """A whole (non-streaming) result of one request."""

    value: T
    timing: RequestTiming
    usage: RequestUsage
    """What the request used, as the pool's metrics counted it (the caller charges it)."""


@dataclass(frozen=True)
class Transcription:
    """A transcript's segments as they are decoded; the stream's usage holds the audio's
    length (`audio_seconds_in`) once it closes."""

    segments: ResultStream[Segment]
    audio_seconds: float


@dataclass(frozen=True)
class SpeechAudio:
    chunks: ResultStream[npt.NDArray[np.int16]]
    """Mono int16 samples, a sentence at a time."""
    sample_rate: int


@dataclass(frozen=True)
class ModelVoice:
    model: str
    voice: Voice


@dataclass(frozen=True)
class Loglikelihood:
    logprob: float
    """Sum of the continuation tokens' log-probabilities given everything before them."""
    is_greedy: bool
    """Every continuation token was the most likely one at its position."""
    scored_tokens: int


@dataclass(frozen=True)
class TokenizeJob:
    """Text or a chat to tokenize (exactly one of them)."""

    text: str | None = None
    chat: ChatRequest | None = None
    add_special_tokens: bool = True
    """Text only: add what the tokenizer puts around a text (BOS, [CLS] … [SEP])."""
    add_generation_prompt: bool = True
    """Chat only: end with the assistant's opening, as a chat request's prompt does."""
    pieces_param: str | None = None
    """The request field that asks for each token's piece (`with_pieces`, `return_token_strs`);
    None: not asked. It is named in the error when the engine cannot tell pieces."""


@dataclass(frozen=True)
class Tokenized:
    model: str
    ids: list[int]
    max_model_len: int | None
    pieces: list[TokenPiece] | None
    """Each token's piece, when the job asked for them."""


@dataclass(frozen=True)
class Detokenized:
    model: str
    text: str


async def charged(meter: UsageMeter | None, work: Awaitable[T]) -> T:
    """The result of `work` (a pool call), what it used charged to `meter`: its result's
    usage, or, when it fails, what it used before failing (the error's `usage`)."""
    try:
        result = await work
    except (ModelpoolError, asyncio.CancelledError) as exc:
        used = usage_carried(exc)
        if meter is not None and used is not None:
            meter.add(used)
        raise
    charge(meter, result)
    return result


def charge(meter: UsageMeter | None, result: object) -> None:
    """Charge what `result` used to the caller's `meter` (None: nobody counts): an `Outcome`'s
    usage at once, a stream's as it grows (read again whenever the meter is)."""
    if meter is None:
        return
    if isinstance(result, Outcome):
        meter.add(result.usage)
    elif isinstance(result, Transcription):
        meter.follow(result.segments)
    elif isinstance(result, SpeechAudio):
        meter.follow(result.chunks)
    elif isinstance(result, ResultStream):
        meter.follow(result)
