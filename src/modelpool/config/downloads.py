"""A served model's download, as its load's first phase: which `hf:` files are not in the
cache yet (`pending_download`, one listing call per repo) and fetching them with progress,
cancellable (`run_download`). The runtime shows the progress and cancels on unload; the
load itself then finds every file in the cache (`sources.locate`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HF_PREFIX, HubLocation, hub_access, hub_reference, model_sources
from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.pull import PullCancelled, PullPlan, PullProgress, plan_pull, pull

__all__ = ["DownloadCallback", "PendingDownload", "PullCancelled", "pending_download", "run_download"]

DownloadCallback = Callable[[int, int, "str | None"], None]
"""(bytes done, bytes total, the file being fetched) — called from the downloading thread."""


@dataclass(frozen=True)
class PendingDownload:
    model_id: str
    plans: tuple[PullPlan, ...]
    access: HubAccess

    @property
    def weights_bytes(self) -> int:
        """Every chosen file, cached or not: the model's size on disk."""
        return sum(plan.total_bytes for plan in self.plans)

    @property
    def missing_bytes(self) -> int:
        return sum(plan.missing_bytes(self.access) for plan in self.plans)


def pending_download(model: ModelConfig, hub: HubLocation) -> PendingDownload | None:
    """The model's `hf:` sources with files still to fetch; None when there is nothing to
    download (no `hf:` source, or all in the cache). ModelSourceError names the model."""
    access = hub_access(hub)
    plans = []
    for source in model_sources(model):
        if not source.startswith(HF_PREFIX):
            continue
        backend = model.backend if source == model.source else ""  # an `assemble` part names its file
        try:
            plan = plan_pull(hub_reference(source, model.id), backend, access)
        except ModelSourceError as exc:
            raise ModelSourceError(f"model '{model.id}': {exc}") from None
        if plan.missing(access):
            plans.append(plan)
    return PendingDownload(model.id, tuple(plans), access) if plans else None


def run_download(pending: PendingDownload, on_progress: DownloadCallback, cancel: threading.Event) -> None:
    """Fetch every missing file, reporting bytes done/total over the whole model."""
    total = pending.missing_bytes
    finished = 0
    for plan in pending.plans:
        already = plan.total_bytes - plan.missing_bytes(pending.access)

        def report(progress: PullProgress, base: int = finished, skip: int = already) -> None:
            on_progress(base + max(progress.done_bytes - skip, 0), total, progress.current)

        try:
            pull(plan, pending.access, on_progress=report, cancel=cancel)
        except ModelSourceError as exc:
            raise type(exc)(f"model '{pending.model_id}': {exc.message}") from None
        finished += plan.total_bytes - already
    on_progress(total, total, None)
