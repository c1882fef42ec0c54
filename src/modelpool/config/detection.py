"""Config entries may leave `backend` out: the loader fills it — and the tasks and options
the entry did not set — from what the model's files are (`modelpool.detect`), before the
config is validated, so every later layer still sees a backend. The entry's own values
win over what was detected.

Local sources (paths, `package:`) are looked at on disk; an `hf:` source through the hub
cache when it is there already. Results are cached per source and its files' stamps, so
loading a config twice reads each GGUF header once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modelpool.config.sources import HF_PREFIX, HubLocation, resolve_source
from modelpool.detect import Detected, LocalView, detect
from modelpool.detect.view import FileView
from modelpool.errors import ConfigError, ModelSourceError


def fill_detected(models: Mapping[str, Any], hub: HubLocation) -> dict[str, Any]:
    """`models` (raw entries by id) with every entry that names no backend completed."""
    filled = dict(models)
    for model_id, entry in models.items():
        if isinstance(entry, Mapping) and entry.get("backend") is None:
            filled[model_id] = completed_entry(str(model_id), entry, hub)
    return filled


def completed_entry(model_id: str, entry: Mapping[str, Any], hub: HubLocation) -> dict[str, Any]:
    """One entry with backend, tasks, options (and the weights file inside a folder source)
    from detection; what the entry says itself is kept."""
    source = entry.get("source")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"model '{model_id}': no `backend`, and no `source` to detect one from")
    try:
        view, detected = detect_source(source, entry.get("assemble"), hub, model_id=model_id)
    except ModelSourceError as exc:
        raise ConfigError(exc.message) from None
    completed = {**entry, "backend": detected.backend}
    if entry.get("tasks") is None:
        completed["tasks"] = [task.value for task in detected.tasks]
    options = {**resolved_options(detected, view), **(entry.get("options") or {})}
    if options:
        completed["options"] = options
    if detected.weights is not None and view.selected is None:
        completed["source"] = f"{source.rstrip('/')}/{detected.weights}"
    return completed


def detect_source(source: str, assemble: object, hub: HubLocation, *, model_id: str) -> tuple[LocalView, Detected]:
    """The view of a source's files and what they are (ModelSourceError when neither can be had).
    Never downloads: an `hf:` source must be in the hub cache already."""
    offline = HubLocation(hub.cache_dir, offline=True)
    try:
        path = resolve_source(source, model_id=model_id, hub=offline)
    except ModelSourceError:
        if not source.startswith(HF_PREFIX):
            raise
        raise ModelSourceError(
            f"model '{model_id}': {source} is not in the hub cache, so its backend cannot be detected "
            "without a download; set `backend:` in its entry (or fetch it first)"
        ) from None
    view = LocalView(path)
    parts = _first_parts(assemble, model_id, offline)
    stamp = _stamp(path) + tuple((name, _stamp(first)) for name, first in sorted(parts.items()))
    named_parts = tuple(sorted((name, str(first)) for name, first in parts.items()))
    return view, _detect_cached(str(path), stamp, named_parts, f"model '{model_id}' ({path})")


def resolved_options(detected: Detected, view: LocalView) -> dict[str, Any]:
    """Detected options, with file names (`mmproj`) made paths on disk."""
    options = dict(detected.options)
    for name in detected.file_options:
        if isinstance(options.get(name), str):
            options[name] = str(view.local_path(options[name]))
    return options


@functools.lru_cache(maxsize=128)
def _detect_cached(path: str, stamp: tuple[object, ...], parts: tuple[tuple[str, str], ...], label: str) -> Detected:
    del stamp  # part of the key only: changed files detect again
    local = LocalView(Path(path))
    view: FileView = _AssembledView(local, dict(parts)) if parts else local
    return detect(view, label=label, selected=local.selected)


class _AssembledView:
    """A source folder as it will be once its `assemble:` files are joined: their names are
    listed, and a joined file's head is its first part's."""

    def __init__(self, folder: LocalView, first_parts: Mapping[str, str]) -> None:
        self.folder, self.first_parts = folder, first_parts

    def names(self) -> Sequence[str]:
        return [*self.folder.names(), *(n for n in self.first_parts if n not in self.folder.names())]

    def read_text(self, name: str, limit: int) -> str | None:
        return self.folder.read_text(name, limit)

    def read_head(self, name: str, size: int) -> bytes | None:
        if name not in self.first_parts:
            return self.folder.read_head(name, size)
        with Path(self.first_parts[name]).open("rb") as reader:
            return reader.read(size)


def _first_parts(assemble: object, model_id: str, hub: HubLocation) -> dict[str, Path]:
    if not isinstance(assemble, Mapping):
        return {}
    return {
        str(name): resolve_source(parts[0], model_id=model_id, hub=hub)
        for name, parts in assemble.items()
        if isinstance(parts, list) and parts and isinstance(parts[0], str)
    }


def _stamp(path: Path) -> tuple[object, ...]:
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)
