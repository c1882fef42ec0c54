"""Compute lanes: engine threads of their own, each with its share of PyTorch's CPU threads.
A batch is split over the lanes free when it starts, instead of one forward on all threads;
with a second batch in flight (the micro-batcher keeps as many as there are lanes) each takes
a lane, so the event loop answers one batch's requests while the other computes.

Why, measured on a 2-core machine (all-MiniLM-L6-v2, 32 one-sentence inputs): two lanes of
one thread each embed 373 sentences/s against 298–324 for one forward on two threads, and
with another process taking half a core, 205 against 127–133. One forward's OpenMP threads
wait for each other at every operator, so when the event loop (parsing requests, writing
replies) takes a core from one of them, the other spins; two single-threaded lanes each go
at their own pace.

PyTorch's thread count is per thread for OpenMP but sets the default that new threads (and
MKL) start with: each lane sets its own, then the process default is put back from a
short-lived thread, so other models in this process keep theirs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from modelpool.backends.threads import EngineThread

T = TypeVar("T")
Row = TypeVar("Row")


def auto_lanes(requested: int, device: str) -> int:
    """`requested` lanes, or for 0 (auto): two on a CPU PyTorch gives two threads or more, else one."""
    if requested:
        return requested
    if device != "cpu":
        return 1
    import torch

    return 2 if torch.get_num_threads() >= 2 else 1


class ComputeLanes:
    """The lanes, each free or computing. A call takes the lanes free when it starts (at
    least one: it waits for one), so two batches in flight each take a lane and go at their
    own pace, while a lone batch is split over both."""

    def __init__(self, name: str, lanes: int) -> None:
        self.count = lanes
        self._threads = [EngineThread(f"{name}-lane{i}") for i in range(lanes)]
        self._free = list(range(lanes))
        self._freed = asyncio.Condition()
        self._waiting = 0
        """Calls that have not taken their lanes yet."""

    async def start(self) -> None:
        """Give each lane its share of PyTorch's threads (one lane: nothing changes)."""
        if self.count < 2:
            return
        import torch

        total = torch.get_num_threads()
        each = max(1, total // self.count)
        await asyncio.gather(*(lane.call(_own_threads, each) for lane in self._threads))
        restore = threading.Thread(target=torch.set_num_threads, args=(total,), name="torch-threads-default")
        restore.start()
        await asyncio.to_thread(restore.join)

    async def map(
        self,
        work: Callable[[Sequence[Row]], T],
        items: Sequence[Row],
        smallest: int,
        smallest_when_busy: int | None = None,
    ) -> list[T]:
        """`work` on contiguous slices of `items`, one per free lane at once (fewer when a
        slice would hold under `smallest` items, or under `smallest_when_busy` when the call
        had to wait for a lane), results in the slices' order.

        Why two sizes: split over idle lanes, a lone batch answers sooner; but once the
        engine is busy, a batch that waited finds its lanes freed together by the batch
        before it, and splitting it keeps every batch split from then on (measured on
        2 cores, 32 clients: 352 of 401 slices were 8 rows), where one lane per batch runs
        bigger slices at a lower cost a row."""
        self._waiting += 1
        try:
            # Batches dispatched together (the micro-batcher starts its batches in one go)
            # all count as waiting before the first one takes lanes: they share the free
            # lanes instead of the first taking them all.
            await asyncio.sleep(0)
            async with self._freed:
                waited = not self._free
                await self._freed.wait_for(lambda: bool(self._free))
                least = smallest_when_busy if waited and smallest_when_busy is not None else smallest
                wanted = max(1, min(self.count, len(items) // max(1, least)))
                share = max(1, len(self._free) // self._waiting)
                taken = self._free[: min(wanted, share)]
                self._free = self._free[len(taken) :]
        finally:
            self._waiting -= 1
        try:
            size = -(-len(items) // len(taken))
            slices = [items[start : start + size] for start in range(0, len(items), size)]
            calls = [self._threads[lane].call(work, part) for lane, part in zip(taken, slices, strict=False)]
            return list(await asyncio.gather(*calls))
        finally:
            async with self._freed:
                self._free = sorted([*self._free, *taken])
                self._freed.notify_all()

    def shutdown(self) -> None:
        for lane in self._threads:
            lane.shutdown()


def _own_threads(count: int) -> None:
    """This thread's PyTorch thread count, kept when the process default changes later."""
    import torch

    # PyTorch sets a thread's count from the process default at its first call (once per
    # thread); made before ours, it cannot later replace ours with the restored default.
    torch.get_num_threads()
    torch.set_num_threads(count)
