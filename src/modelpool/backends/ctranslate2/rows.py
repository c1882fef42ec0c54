"""One request inside a CTranslate2 batch: its tokens arrive through CT2's per-step callback
(on a CT2 worker thread), become text (held back while it might be a stop string) and cross
to the event loop through the request's `Channel`. Everything a row decides for itself
happens here: its own end, its own `max_tokens`, its stop strings, its logprobs, and
leaving when its consumer went away (the callback then tells CT2 to stop the row)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.ctranslate2.batching import BatchKey, batch_key
from modelpool.backends.textgen.channel import Channel
from modelpool.backends.textgen.logprobs import best, decoded, entry, log_softmax
from modelpool.backends.textgen.sequence import Detokenizer, TextSequence
from modelpool.inference import GenerationChunk, SamplingParams, TokenLogprob


class Row(TextSequence):
    def __init__(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new: int,
        channel: Channel[GenerationChunk],
        detok: Detokenizer,
        tokenizer: Any,
        end_ids: frozenset[int],
    ) -> None:
        super().__init__(sampling=params, max_new=max_new, output=channel, detok=detok, end_ids=end_ids,
                         prompt_tokens=len(prompt))  # fmt: skip
        self.prompt = prompt
        self.tokenizer = tokenizer
        """For the text of logprob entries (decode of one id)."""
        self.arrived = time.monotonic()
        self.key: BatchKey = batch_key(params, max_new)
        self._step_logprob: float | None = None
        self._step_logits: npt.NDArray[np.float32] | None = None

    @property
    def prompt_length(self) -> int:
        return len(self.prompt)

    @property
    def alive(self) -> bool:
        """Not finished, and someone still reads it."""
        return not self.done and not self.cancelled

    def step(self, token: int, log_prob: float | None, logits: npt.NDArray[np.float32] | None) -> bool:
        """Take one generated token; True when the row is finished (CT2 then stops it)."""
        if not self.alive:
            self.done = True
            return True
        self._step_logprob, self._step_logits = log_prob, logits
        return self.accept(token)

    def replay(self, tokens: list[int]) -> None:
        """A beam search's answer, known whole at its end: its tokens go through the row one
        by one, as if streamed (stops, max_tokens, text, usage), then the row ends; a
        hypothesis that ran out without an end token ended at CT2's `max_length`."""
        for token in tokens:
            if self.step(token, None, None):
                return
        self.finish("length", hit_stop=False)

    def logprob(self, token: int) -> TokenLogprob:
        """The token's log-probability under the distribution CT2 chose it from (before
        temperature and top-k/p, after the repetition penalty), and its top alternatives."""
        top_n, logits = self.sampling.logprobs or 0, self._step_logits
        top = best(log_softmax(logits), top_n) if top_n and logits is not None else []
        spell = decoded(self.tokenizer)
        # CT2 gives the log-probability whenever the batch asked for it (`return_scores`).
        return entry(token, float(self._step_logprob or 0.0), spell(token), top, spell)
