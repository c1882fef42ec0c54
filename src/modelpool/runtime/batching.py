"""Micro-batching: embedding (or pair-scoring) requests that arrive close together run as
one engine call.

The first request of a batch waits `window_ms` for others, and again while more keep
arriving (up to `max_window_ms`); a batch is bounded by input count and padded tokens.
Rows go back to each caller in order. A failing batch fails every request in it, and the
worker keeps going. Callers that went away are skipped.

An engine that computes several batches at once (`concurrency`: its compute lanes) gets up
to that many in flight: while one computes, the event loop answers the other's requests and
the next batch gathers. Free slots share what is queued (32 waiting inputs and two free
lanes: two batches of 16, started together), so no lane waits on a batch that took all.
Why, measured on 2 cores (32 clients of one-sentence embeddings): one batch at a time split
over both lanes left a core idle while the loop wrote 32 replies and read 32 requests.

With batches in flight, each batch is sized to a fair share of all the inputs the engine
has (queued + computing, over its `concurrency`): a freed slot waits (up to `max_window_ms`)
until its share has come in, and takes no more than it. Why, measured on 2 cores: the
clients of a batch send their next requests together, so each batch's clients stay a
cohort, and cohorts drifted apart (batches of 5 beside 27, alternating: a lane running 5
rows pays nearly what 16 cost). Fair shares keep them even: 293 against 266 requests/s
(5 rounds, side by side), 5.8 against 6.4 ms of the server's CPU per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sized
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from modelpool.config.schema import BatchConfig
from modelpool.errors import ModelUnloaded
from modelpool.runtime.clock import within
from modelpool.runtime.detached import detached_task

log = logging.getLogger("modelpool.runtime")
Item = TypeVar("Item", bound=Sized)
"""One input of a batch (token ids, an encoded pair); its length is its tokens."""


@dataclass
class _Job(Generic[Item]):
    ids: list[Item]
    result: asyncio.Future[npt.NDArray[np.float32]] = field(repr=False)

    @property
    def longest(self) -> int:
        return max(len(i) for i in self.ids)


class Batcher(Generic[Item]):
    def __init__(
        self,
        compute: Callable[[list[Item]], Awaitable[npt.NDArray[np.float32]]],
        config: BatchConfig,
        name: str,
        pause: Callable[[float], Awaitable[None]] | None = None,
        concurrency: int = 1,
    ) -> None:
        """`compute(items)` gives one row per item, in order (embedding vectors, pair scores).
        `pause(seconds)`: how the batch waits for more (tests step through it); by default
        up to `seconds`, ending early when the batch fills.
        `concurrency`: batches the engine computes at once."""
        self._compute = compute
        self._pause = pause or self._until_full
        self._config = config
        self._name = name
        self._concurrency = concurrency
        self._jobs: deque[_Job[Item]] = deque()
        self._queued_inputs = 0
        """The inputs of `_jobs`, kept as they come and go: each arrival asks whether a filling
        batch is full, which must not cost a walk of the queue."""
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None] | None, list[_Job[Item]]] = {}
        """The batches computing now (None: the one the worker itself awaits)."""
        self._slot_freed = asyncio.Event()
        self._filled = asyncio.Event()
        self._filling = False
        """The worker is waiting for a batch to fill: each arrival checks whether it has."""
        self.batches_run = 0

    async def run(self, ids: list[Item]) -> npt.NDArray[np.float32]:
        """The rows for `ids`, computed in a batch with whatever else arrives meanwhile."""
        job = _Job(ids, asyncio.get_running_loop().create_future())
        self._jobs.append(job)
        self._queued_inputs += len(ids)
        self._wake.set()
        if self._filling and self._full():
            self._filled.set()
        if self._worker is None:
            # Its own context: it serves every request after this one, whose usage and trace it must not keep.
            self._worker = detached_task(self._work(), name=f"batcher-{self._name}")
        return await job.result  # if this caller is cancelled, the future is too: the worker skips it

    async def close(self) -> None:
        tasks = [task for task in [self._worker, *self._running] if task is not None]
        # Taken before the cancels: a finished batch task leaves `_running` by itself.
        unfinished = [*(job for batch in self._running.values() for job in batch), *self._jobs]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._worker = None
        for job in [*unfinished, *self._jobs]:
            if not job.result.done():
                job.result.set_exception(ModelUnloaded(f"model '{self._name}' was unloaded"))
        self._jobs.clear()
        self._queued_inputs = 0
        self._running = {}

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._jobs:
                while len(self._running) >= self._concurrency:
                    self._slot_freed.clear()
                    await self._slot_freed.wait()
                await self._fill()
                batches = self._take_shares(self._concurrency - len(self._running))
                if self._concurrency == 1:  # one batch at a time: computed right here
                    for batch in batches:
                        self._running[None] = batch
                        await self._run_batch(batch)
                        del self._running[None]
                    continue
                for batch in batches:  # all started before any takes its lanes (ComputeLanes)
                    task = asyncio.create_task(self._run_batch(batch), name=f"batch-{self._name}")
                    self._running[task] = batch
                    task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._slot_freed.set()

    async def _run_batch(self, batch: list[_Job[Item]]) -> None:
        try:
            rows = await self._compute([ids for job in batch for ids in job.ids])
        except Exception as exc:
            log.warning("batch failed", extra={"model": self._name, "error": str(exc)})
            for job in batch:
                if not job.result.done():
                    job.result.set_exception(exc)
            return
        self.batches_run += 1
        start = 0
        for job in batch:
            if not job.result.done():
                job.result.set_result(rows[start : start + len(job.ids)])
            start += len(job.ids)

    def _take_shares(self, slots: int) -> list[list[_Job[Item]]]:
        """Up to `slots` batches from the queue, each about an equal share of its inputs (and,
        when batches gather, of all the engine has: see the module's docstring)."""
        share = -(-self._queued() // max(1, slots))
        if self._config.window_ms > 0:
            share = min(share, self._fair_share())
        batches: list[list[_Job[Item]]] = []
        while self._jobs and len(batches) < slots:
            batch = self._take(min(share, self._config.max_batch_size))
            if batch:
                batches.append(batch)
        return batches

    def _take(self, most_inputs: int) -> list[_Job[Item]]:
        """Jobs in arrival order while the batch stays within its limits (at least one job)."""
        batch: list[_Job[Item]] = []
        inputs = longest = 0
        while self._jobs:
            job = self._jobs[0]
            if job.result.done():  # the caller went away
                self._queued_inputs -= len(self._jobs.popleft().ids)
                continue
            grown_inputs, grown_longest = inputs + len(job.ids), max(longest, job.longest)
            too_many = grown_inputs > most_inputs
            if batch and (too_many or grown_inputs * grown_longest > self._config.max_batch_tokens):
                break
            batch.append(self._jobs.popleft())
            self._queued_inputs -= len(job.ids)
            inputs, longest = grown_inputs, grown_longest
        return batch

    async def _fill(self) -> None:
        """Wait `window_ms`, then another while inputs came in during the last one, until the
        batch is full or `max_window_ms` has passed. Why: 32 clients answered together send
        their next requests one after another as the event loop reads them; a single fixed
        window cut that burst into a small batch and a big one (measured: 3 + 29), and a
        small batch costs the engine nearly what a big one does."""
        window = self._config.window_ms / 1000
        if window <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self._config.max_window_ms / 1000, window)
        seen = -1
        self._filling = True
        try:
            while not self._full():
                queued = self._queued()
                left = deadline - loop.time()
                # A quiet window ends the wait once this batch's fair share is in; short of it,
                # the rest of its cohort is still coming (up to max_window).
                if left <= 0 or (queued == seen and not self._short_of_share()):
                    return
                seen = queued
                await self._pause(min(window, left))
        finally:
            self._filling = False

    async def _until_full(self, seconds: float) -> None:
        """Wait `seconds`, or less: the arrival that fills the batch ends the wait. Why,
        measured on 2 cores (32 clients, two lanes): a freed lane otherwise waited out the
        window after its last input came in, a core idle while the other lane computed."""
        self._filled.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await within(self._filled.wait(), seconds)

    def _queued(self) -> int:
        return self._queued_inputs

    def _full(self) -> bool:
        return self._queued() >= min(self._config.max_batch_size, self._fair_share())

    def _short_of_share(self) -> bool:
        """Batches are computing and the queue holds less than a fair share of all inputs."""
        return self._computing() > 0 and self._queued() < self._fair_share()

    def _computing(self) -> int:
        return sum(len(job.ids) for batch in self._running.values() for job in batch)

    def _fair_share(self) -> int:
        """The inputs queued and computing, over the batches the engine computes at once;
        with nothing computing, every input queued (a burst from idle gathers whole)."""
        computing = self._computing()
        if not computing:
            return self._config.max_batch_size
        return max(1, -(-(self._queued() + computing) // self._concurrency))
