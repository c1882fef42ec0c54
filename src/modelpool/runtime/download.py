"""A load's first phase for a model whose `hf:` weights are not cached: the download.

It runs before the capacity check and holds no room (the slot is `loading`, counted with
no estimate yet), but a model that could never fit the budget is refused first, from the
repo listing's byte size, so nothing is downloaded for it. Progress (bytes done/total)
shows in the model's status as state `downloading`; a request meanwhile gets a 503 that
says how far it got, with Retry-After, instead of waiting. `cancel()` (an unload, the
server closing) stops the download within one chunk; the load then fails as cancelled.
"""

from __future__ import annotations

import asyncio
import threading
import time

from modelpool.config.downloads import PendingDownload, PullCancelled, pending_download, run_download
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.errors import InsufficientCapacity, ModelNotReady
from modelpool.status import DownloadStatus

MiB = 1024 * 1024
MIN_RETRY_S, MAX_RETRY_S = 2.0, 60.0


class Download:
    """One model's download in flight: progress written by the worker thread, read by status."""

    def __init__(self, pending: PendingDownload, cancel_event: threading.Event) -> None:
        self.pending = pending
        self.total_bytes = pending.missing_bytes
        self.done_bytes = 0
        self.file: str | None = None
        self.started = time.monotonic()
        self.cancel_event = cancel_event

    def update(self, done: int, total: int, file: str | None) -> None:
        self.done_bytes, self.total_bytes, self.file = done, total, file

    def cancel(self) -> None:
        self.cancel_event.set()

    def status(self) -> DownloadStatus:
        seconds = round(time.monotonic() - self.started, 3)
        return DownloadStatus(self.done_bytes, self.total_bytes, self.file, seconds)

    def not_ready(self, model_id: str) -> ModelNotReady:
        """The 503 a request gets meanwhile: how far, and when to ask again."""
        status = self.status()
        rate = status.done_bytes / status.seconds if status.seconds > 0 else 0.0
        left = (status.total_bytes - status.done_bytes) / rate if rate > 0 else MAX_RETRY_S
        return ModelNotReady(
            f"model '{model_id}' is downloading its weights: {status.done_bytes / MiB:.1f} of "
            f"{status.total_bytes / MiB:.1f} MiB ({status.percent}%); retry later",
            retry_after_s=min(max(left, MIN_RETRY_S), MAX_RETRY_S),
        )


async def plan_download(
    model: ModelConfig, hub: HubLocation, room_for: int | None, cancel: threading.Event
) -> Download | None:
    """What the model must download, planned off the loop (one listing call per repo); None
    when its files are all cached. `room_for`: the most bytes of weights the pool could ever
    hold (None: no limit) — a model bigger than that is refused before any download.
    `cancel`, set meanwhile (an unload during the listing), stops it before the download."""
    pending = await asyncio.to_thread(pending_download, model, hub)
    if cancel.is_set():
        raise PullCancelled(f"model '{model.id}': its download was cancelled")
    if pending is None:
        return None
    if room_for is not None and pending.weights_bytes > room_for:
        raise InsufficientCapacity(
            f"cannot load model '{model.id}': its weights are {pending.weights_bytes // MiB} MiB and the pool's "
            f"budget holds at most {room_for // MiB} MiB, so they are not downloaded"
        )
    return Download(pending, cancel)


async def fetch(download: Download) -> None:
    """Fetch the missing files off the loop; PullCancelled once `download.cancel()` was called."""
    await asyncio.to_thread(run_download, download.pending, download.update, download.cancel_event)
