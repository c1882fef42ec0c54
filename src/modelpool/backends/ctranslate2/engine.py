"""Batched generation on CTranslate2, each request streamed on its own.

Why this shape (SmolLM2-135M int8, 2 CPU cores shared with other work, 128 greedy tokens a
stream; numbers vary ±30% with the machine's load, these are medians of side-by-side runs):

* `generate_tokens` is `generate_batch(asynchronous=True)` with a callback, one request per
  call. Sixteen of them on two CT2 workers made ~55 tokens/s in all, with a median first
  token after ~13 s: each request waits for whole generations ahead of it.
* One `generate_batch` over the sixteen, its per-step callback streaming each row: ~240
  tokens/s on one worker with one thread; 220 with two threads on that batch (the matrices
  of a 135M model are too small to split); ~200 as two batches of eight on two workers.

So requests are batched, as many as can share a batch (see `batching`): each of `workers`
threads waits for requests, lets a burst gather (`gather_wait`), runs one `generate_batch`
over it and comes back. CT2 cannot add rows to a running batch, so a request that arrives
while a batch runs waits for a free worker: the second worker (the default) keeps that
wait short instead of a whole generation long. Through the API this gave 1 stream
~45-70 tokens/s (first token ~50-70 ms) and 16 streams ~190-230 tokens/s (first token
p50 ~0.4-0.5 s); the transformers backend, side by side, 15-27 and 167-184.

The callback runs on CT2's worker thread: it hands the row its token, and its answer
stops the row in CT2 (finished, or its consumer went away).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool.backends.ctranslate2.batching import BatchKey, take_batch
from modelpool.backends.ctranslate2.rows import Row
from modelpool.backends.textgen.step_failure import generation_failed, sequence_failed
from modelpool.errors import InvalidRequest, ModelUnloaded

log = logging.getLogger("modelpool.backends")


@dataclass(frozen=True)
class BatchPolicy:
    workers: int
    """Batches running at once (CT2's `inter_threads`)."""
    max_batch_size: int
    max_prompt_spread: int
    """Most tokens between the shortest and the longest prompt of a batch."""
    gather_s: float
    """A free worker waits for more requests while they keep coming less than this apart,
    and for at most `GATHER_CAP` times this in all."""


GATHER_CAP = 10


def gather_wait(oldest: float, newest: float, now: float, policy: BatchPolicy) -> float:
    """Seconds a free worker should still wait before it takes a batch (≤ 0: take it now):
    until the requests have stopped coming for `gather_s`, or the oldest has waited the cap."""
    return min(newest + policy.gather_s, oldest + GATHER_CAP * policy.gather_s) - now


class BatchEngine:
    def __init__(self, generator: Any, vocabulary: list[str], end_ids: frozenset[int], policy: BatchPolicy) -> None:
        self.generator = generator
        self.vocabulary = vocabulary
        """Token id → the token string CT2 takes prompts in."""
        self._end_ids = sorted(end_ids)
        self.policy = policy
        self.batches_run = 0
        self.largest_batch = 0
        self._cond = threading.Condition()
        self._waiting: list[Row] = []
        self._running: list[Row] = []
        self._stop = threading.Event()
        """Set by `close`: running batches end at their next step, workers take no more."""
        self._workers = [
            threading.Thread(target=self._work, name=f"ct2-batcher-{i}", daemon=True) for i in range(policy.workers)
        ]
        for worker in self._workers:
            worker.start()

    # ----- from other threads --------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests waiting or in a running batch and not finished (a snapshot)."""
        with self._cond:
            return sum(1 for row in [*self._waiting, *self._running] if not row.done)

    def submit(self, row: Row) -> None:
        with self._cond:
            if self._stop.is_set():
                row.fail(ModelUnloaded("the model is being unloaded"))
                return
            self._waiting.append(row)
            self._cond.notify()

    def close(self) -> None:
        """Stop: running batches end at their next step, waiting requests get an error."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        for worker in self._workers:
            worker.join()
        # The generator goes here, on the caller's thread, never on one of CT2's own.
        self.generator = None
        for row in self._waiting:
            row.fail(ModelUnloaded("the model was unloaded before this request ran"))
        self._waiting.clear()

    # ----- the worker threads --------------------------------------------------------

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run(batch)
            with self._cond:
                self._running = [row for row in self._running if row not in batch]

    def _next_batch(self) -> list[Row] | None:
        policy = self.policy
        with self._cond:
            while True:
                while not self._waiting and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return None
                # A burst shares one batch: gather while its requests keep coming, up to a cap.
                wait = gather_wait(self._waiting[0].arrived, self._waiting[-1].arrived, time.monotonic(), policy)
                if wait > 0 and len(self._waiting) < policy.max_batch_size:
                    self._cond.wait(wait)
                    continue
                batch = take_batch(self._waiting, policy.max_batch_size, policy.max_prompt_spread, lambda r: r.alive)
                if batch:
                    self._running += batch
                    return batch

    def _run(self, batch: list[Row]) -> None:
        key = batch[0].key
        batch = self._refuse_bad_prompts(batch)
        if not batch:
            return
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(batch))

        try:  # whatever goes wrong fails this batch's requests, never the worker
            prompts = [[self.vocabulary[t] for t in row.prompt] for row in batch]
            if key.beam_size > 1:
                self._beam_search(prompts, key, batch)
                return
            callback = _step_callback(batch, key.top_logprobs, self._stop)
            self.generator.generate_batch(prompts, **self._options(key, batch), callback=callback)
        except Exception as exc:  # the batch as a whole: which row caused it cannot be told
            log.error("a CTranslate2 batch failed: %r", exc, exc_info=exc)
            for row in batch:
                row.fail(generation_failed(row.request_id))
            return
        for row in batch:  # CT2 ended a row without telling the callback why (its own max_length)
            if self._stop.is_set():
                row.fail(ModelUnloaded("the model was unloaded while this request ran"))
            else:
                row.finish("length", hit_stop=False)

    def _beam_search(self, prompts: list[list[str]], key: BatchKey, batch: list[Row]) -> None:
        """CT2's own beam search over the batch. It takes no per-step callback (CT2 calls one
        only when `beam_size` is 1), so each row's answer comes whole at the end and is
        replayed through the row; a row whose client left meanwhile is dropped then (CT2
        cannot stop a beam search early: it runs to the rows' shared `max_length`)."""
        options = {**self._options(key, batch), "beam_size": key.beam_size, "length_penalty": key.length_penalty,
                   "max_length": key.beam_length, "num_hypotheses": 1, "return_end_token": True}  # fmt: skip
        results = self.generator.generate_batch(prompts, **options)
        for row, result in zip(batch, results, strict=True):
            if self._stop.is_set():
                row.fail(ModelUnloaded("the model was unloaded while this request ran"))
            else:
                row.replay([int(token) for token in result.sequences_ids[0]])

    def _refuse_bad_prompts(self, batch: list[Row]) -> list[Row]:
        """A token id outside the vocabulary would fail the whole batch: its row fails alone
        (the backend checks request ids before this), the others run."""
        size, kept = len(self.vocabulary), []
        for row in batch:
            bad = next((t for t in row.prompt if not 0 <= t < size), None)
            if bad is None:
                kept.append(row)
            else:
                row.fail(InvalidRequest(f"token id {bad} is outside the vocabulary (0..{size - 1})", param="prompt"))
        return kept

    def _options(self, key: BatchKey, batch: list[Row]) -> dict[str, Any]:
        longest = max(row.max_new for row in batch)
        return {
            "max_length": longest,
            # ignore_eos: no end token before the longest row's end (each row stops itself at its own).
            "min_length": longest if key.ignore_eos else min(key.min_tokens, longest),
            "sampling_topk": key.top_k,
            "sampling_topp": key.top_p,
            "sampling_temperature": key.temperature,
            "repetition_penalty": key.repetition_penalty,
            "end_token": self._end_ids,
            "return_scores": key.logprobs,
            "return_logits_vocab": key.top_logprobs,
            "include_prompt_in_result": False,
            "beam_size": 1,
        }


def _step_callback(batch: list[Row], top_logprobs: bool, stop: threading.Event) -> Callable[[Any], bool]:
    """CT2's per-token callback for a batch. It holds the rows and nothing that leads back to
    the generator: CT2 drops the callback on its own worker thread, and were that the last
    reference to the generator, its destructor would join that very thread (a C++
    `std::system_error`, "Resource deadlock avoided", that aborts the process)."""

    def on_step(step: Any) -> bool:
        row = batch[step.batch_id]
        try:
            logits = _row_logits(step.logits) if top_logprobs else None
            return row.step(int(step.token_id), step.log_prob, logits) or stop.is_set()
        except Exception as exc:  # a bad row must not take CT2's batch (and its other rows) down
            row.fail(sequence_failed(row.request_id, exc, what="a CTranslate2 row's step"))
            return True

    return on_step


def _row_logits(view: Any) -> npt.NDArray[np.float32]:
    """One step's logits (a CT2 StorageView of shape [1, vocab]) as float32 on the CPU."""
    import ctranslate2

    if view.device != "cpu":
        view = view.to_device(ctranslate2.Device.cpu)
    if view.dtype != ctranslate2.DataType.float32:
        view = view.to(ctranslate2.DataType.float32)
    return np.asarray(view).reshape(-1)
