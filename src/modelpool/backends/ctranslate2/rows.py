"""One request inside a CTranslate2 batch: its tokens arrive through CT2's per-step callback
(on a CT2 worker thread), become text (held back while it might be a stop string) and cross
to the event loop through the request's `Channel`. Everything a row decides for itself
happens here: its own end, its own `max_tokens`, its stop strings, its logprobs, and
leaving when its consumer went away (the callback then tells CT2 to stop the row)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.ctranslate2.batching import BatchKey, batch_key
from modelpool.backends.textgen.channel import Channel
from modelpool.backends.textgen.decoding import StopMatcher
from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob, TopLogprob, Usage
from modelpool.logs import current_request_id


@dataclass(eq=False)
class Row:
    prompt: list[int]
    params: SamplingParams
    max_new: int
    channel: Channel[GenerationChunk]
    detok: IncrementalDetokenizer
    tokenizer: Any
    """For the text of logprob entries (decode of one id)."""
    end_ids: frozenset[int]
    arrived: float = field(default_factory=time.monotonic)
    generated: int = 0
    done: bool = False
    key: BatchKey = field(init=False)
    stops: StopMatcher = field(init=False)
    pending: list[TokenLogprob] = field(default_factory=list)
    reported: int = 0
    """Of `generated`, those a chunk has counted (`GenerationChunk.token_count`)."""
    request_id: str = field(default_factory=current_request_id.get)
    """The request this row serves (made in its context), for the log and its errors."""

    def __post_init__(self) -> None:
        self.key = batch_key(self.params)
        self.stops = StopMatcher(self.params.stop)

    @property
    def prompt_length(self) -> int:
        return len(self.prompt)

    @property
    def alive(self) -> bool:
        """Not finished, and someone still reads it."""
        return not self.done and not self.channel.cancelled.is_set()

    def step(self, token: int, log_prob: float | None, logits: npt.NDArray[np.float32] | None) -> bool:
        """Take one generated token; True when the row is finished (CT2 then stops it)."""
        if not self.alive:
            self.done = True
            return True
        if token in self.end_ids:
            self.finish("stop", hit_stop=False)
            return True
        self.generated += 1
        if self.params.logprobs is not None:
            self.pending.append(self._logprob(token, log_prob, logits))
        text, hit_stop = self.stops.feed(self.detok.add(token), armed=self.generated >= self.params.min_tokens)
        if text or hit_stop:
            self.channel.put(GenerationChunk(text, tuple(self.pending), token_count=self._unreported()))
            self.pending = []
        if hit_stop:
            self.finish("stop", hit_stop=True)
        elif self.generated >= self.max_new:
            self.finish("length", hit_stop=False)
        return self.done

    def finish(self, reason: str, *, hit_stop: bool) -> None:
        """The last chunk (with what was held back for a stop string that never came)."""
        if self.done:
            return
        self.done = True
        tail = ""
        if not hit_stop:
            tail, hit = self.stops.feed(self.detok.flush())
            tail += "" if hit else self.stops.flush()
        usage = Usage(len(self.prompt), self.generated)
        self.channel.put(GenerationChunk(tail, tuple(self.pending), reason, usage, stop_sequence=self.stops.matched,
                                         token_count=self._unreported()))  # fmt: skip
        self.channel.end()

    def _unreported(self) -> int:
        """The generated tokens no chunk has counted yet (the next chunk counts them)."""
        count, self.reported = self.generated - self.reported, self.generated
        return count

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.done = True
            self.channel.end(error)

    def _logprob(self, token: int, log_prob: float | None, logits: npt.NDArray[np.float32] | None) -> TokenLogprob:
        """The token's log-probability under the distribution CT2 chose it from (before
        temperature and top-k/p, after the repetition penalty), and its top alternatives."""
        text = self._text(token)
        top: tuple[TopLogprob, ...] = ()
        top_n = self.params.logprobs or 0
        if top_n and logits is not None:
            logprobs = log_softmax(logits)
            best = np.argpartition(-logprobs, top_n)[:top_n]
            best = best[np.argsort(-logprobs[best])]
            top = tuple(TopLogprob(self._text(int(t)), float(logprobs[t]), tuple(self._text(int(t)).encode()))
                        for t in best)  # fmt: skip
        # CT2 gives the log-probability whenever the batch asked for it (`return_scores`).
        return TokenLogprob(text, float(log_prob or 0.0), tuple(text.encode()), top, token_id=token)

    def _text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))


def log_softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    result: npt.NDArray[np.float64] = shifted - np.log(np.exp(shifted).sum())
    return result
