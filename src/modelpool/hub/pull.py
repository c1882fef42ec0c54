"""Download the files a backend needs from a repo, with progress, cancellable.

`plan_pull` lists the repo at the reference's revision (one API call; offline, the cache's
snapshot) and chooses the files (`select.files_for`); `pull` fetches them one by one through
`hf_hub_download` into the Hugging Face cache, at the listed commit (so a moving branch
cannot mix two commits), reporting bytes done/total to `on_progress` as they arrive.

Cancelling (`cancel.set()` from any thread) stops within one chunk (10 MB): the progress
hook huggingface_hub calls raises `PullCancelled`, which leaves the file's
`.incomplete` blob behind (a later pull resumes it with a Range request) and never a file
that looks complete.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.listing import RepoListing, hub_error, list_repo, offline_message, record_ref, snapshot_folder
from modelpool.hub.reference import HubReference, Selector
from modelpool.hub.select import files_for

WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx", ".pt", ".pth", ".npz", ".msgpack")


class PullCancelled(ModelSourceError):
    """The pull was cancelled (an unload, Ctrl-C)."""


@dataclass
class FileProgress:
    name: str
    total: int
    done: int = 0


@dataclass
class PullProgress:
    """Bytes done/total per file and overall; updated from the downloading thread."""

    files: dict[str, FileProgress] = field(default_factory=dict)
    current: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.total for f in self.files.values())

    @property
    def done_bytes(self) -> int:
        return sum(min(f.done, f.total) if f.total else f.done for f in self.files.values())


ProgressCallback = Callable[[PullProgress], None]


@dataclass(frozen=True)
class PullPlan:
    ref: HubReference
    backend: str
    listing: RepoListing
    files: tuple[str, ...]

    @property
    def folder(self) -> Path | None:
        return None

    @property
    def total_bytes(self) -> int:
        return sum(self.listing.sizes.get(name, 0) for name in self.files)

    def local_folder(self, access: HubAccess) -> Path:
        return snapshot_folder(access, self.listing)

    def missing(self, access: HubAccess) -> list[str]:
        """The chosen files not yet in the cache's snapshot."""
        folder = self.local_folder(access)
        return [name for name in self.files if not (folder / name).is_file()]

    def missing_bytes(self, access: HubAccess) -> int:
        return sum(self.listing.sizes.get(name, 0) for name in self.missing(access))

    def model_path(self, access: HubAccess) -> Path:
        """What a backend loads: the one file named, the (first part of the) GGUF model, or the folder."""
        folder = self.local_folder(access)
        if self.ref.filename is not None and not self.ref.filename.lower().endswith(".gguf"):
            return folder / self.ref.filename
        if not self.backend and self.ref.selector == Selector():
            return folder  # the repo as a whole, for whoever looks at it next (detection)
        models = [name for name in self.files if name.lower().endswith(".gguf") and "mmproj" not in name.lower()]
        return folder / models[0] if models else folder


def plan_pull(ref: HubReference, backend: str, access: HubAccess) -> PullPlan:
    """What pulling `ref` for `backend` takes: the listing and the chosen files."""
    listing = list_repo(ref, access)
    files = files_for(backend, listing.names(), ref.selector)
    if listing.from_cache and backend and not any(name.endswith(WEIGHT_SUFFIXES) for name in files):
        raise ModelSourceError(offline_message(ref, access))  # a partial snapshot: config files only
    return PullPlan(ref, backend, listing, tuple(files))


def pull(
    plan: PullPlan,
    access: HubAccess,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Fetch the plan's missing files; returns `plan.model_path`. Raises PullCancelled or
    ModelSourceError (never with the token in it)."""
    cancel = cancel or threading.Event()
    progress = PullProgress({name: FileProgress(name, plan.listing.sizes.get(name, 0)) for name in plan.files})
    folder = plan.local_folder(access)
    for name in plan.files:
        if (folder / name).is_file():
            progress.files[name].done = progress.files[name].total
    _report(on_progress, progress)
    for name in plan.missing(access):
        if cancel.is_set():
            raise PullCancelled(f"pulling {plan.ref} was cancelled")
        if access.offline:
            raise ModelSourceError(offline_message(plan.ref, access))
        progress.current = name
        _fetch(plan, name, access, _hook(progress, progress.files[name], on_progress, cancel))
        progress.files[name].done = progress.files[name].total
        _report(on_progress, progress)
    progress.current = None
    record_ref(access, plan.listing)
    return plan.model_path(access)


def _fetch(plan: PullPlan, name: str, access: HubAccess, hook: type[Any]) -> None:
    import huggingface_hub

    try:
        huggingface_hub.hf_hub_download(
            plan.ref.repo_id,
            name,
            revision=plan.listing.commit,
            cache_dir=access.cache_root,
            endpoint=access.endpoint,
            token=access.client_token(),
            tqdm_class=hook,
        )
    except PullCancelled:
        raise
    except Exception as exc:
        raise hub_error(plan.ref, access, exc) from None


def _report(on_progress: ProgressCallback | None, progress: PullProgress) -> None:
    if on_progress is not None:
        on_progress(progress)


def _hook(
    progress: PullProgress, file: FileProgress, on_progress: ProgressCallback | None, cancel: threading.Event
) -> type[Any]:
    """A class huggingface_hub takes for its progress bar (`tqdm_class`): it counts the
    bytes into `file`, reports, and raises PullCancelled once `cancel` is set."""

    class Hook:
        def __init__(self, *_: object, total: int | None = None, initial: int = 0, **__: object) -> None:
            if total:
                file.total = total
            file.done = initial
            self._check()

        def __enter__(self) -> Hook:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def update(self, n: float | None = 1) -> None:
            file.done += int(n or 0)
            _report(on_progress, progress)
            self._check()

        def close(self) -> None:
            return None

        def _check(self) -> None:
            if cancel.is_set():
                raise PullCancelled(f"pulling {file.name} was cancelled")

    return Hook
