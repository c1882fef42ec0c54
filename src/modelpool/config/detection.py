"""Config entries may leave `backend` out: the loader fills it — and the tasks and options
the entry did not set — from what the model's files are (`modelpool.detect`), before the
config is validated, so every later layer still sees a backend. The entry's own values
win over what was detected.

Local sources (paths, `package:`) are looked at on disk (results cached per source and its
files' stamps, so loading a config twice reads each GGUF header once); an `hf:` source
through the hub's `HubView` — its listing, small JSON files and a GGUF header by a ranged
GET, never the weights (cached per reference for the process's life).
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpool.config.sources import HF_PREFIX, HubLocation, hub_access, hub_reference, resolve_source
from modelpool.detect import Detected, LocalView, detect
from modelpool.detect.gguf_rules import is_projector
from modelpool.detect.view import FileView
from modelpool.errors import ConfigError, ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.reference import HubReference
from modelpool.hub.select import files_for
from modelpool.hub.view import HubView


def fill_detected(models: Mapping[str, Any], hub: HubLocation) -> dict[str, Any]:
    """`models` (raw entries by id) with every entry that names no backend completed."""
    filled = dict(models)
    for model_id, entry in models.items():
        if isinstance(entry, Mapping) and entry.get("backend") is None:
            filled[model_id] = completed_entry(str(model_id), entry, hub)
    return filled


def completed_entry(model_id: str, entry: Mapping[str, Any], hub: HubLocation) -> dict[str, Any]:
    """One entry with backend, tasks, options (and the weights file inside a local folder)
    from detection; what the entry says itself is kept."""
    source = entry.get("source")
    if not isinstance(source, str) or not source:
        raise ConfigError(f"model '{model_id}': no `backend`, and no `source` to detect one from")
    try:
        found = inspect_source(source, entry.get("assemble"), hub, model_id=model_id)
    except ModelSourceError as exc:
        raise ConfigError(exc.message) from None
    detected, view = found.detected, found.local
    completed = {**entry, "backend": detected.backend}
    if entry.get("tasks") is None:
        completed["tasks"] = [task.value for task in detected.tasks]
    options = {**resolved_options(detected, view), **(entry.get("options") or {})}
    if options:
        completed["options"] = options
    if view is not None and detected.weights is not None and view.selected is None:
        completed["source"] = f"{source.rstrip('/')}/{detected.weights}"
    return completed


@dataclass(frozen=True)
class Inspection:
    """A source's files as detection saw them, and what it found."""

    detected: Detected
    local: LocalView | None = None
    """On disk (a path, `package:`)."""
    hub: HubView | None = None
    """A hub repo at its revision (`hf:`)."""


def inspect_source(source: str, assemble: object, hub: HubLocation, *, model_id: str) -> Inspection:
    """What `source` holds (ModelSourceError when it cannot be looked at or no layout fits)."""
    if source.startswith(HF_PREFIX):
        view, detected = _hub_inspection(source, hub_access(hub), model_id)
        return Inspection(detected, hub=view)
    local, detected = detect_source(source, assemble, hub, model_id=model_id)
    return Inspection(detected, local=local)


def detect_source(source: str, assemble: object, hub: HubLocation, *, model_id: str) -> tuple[LocalView, Detected]:
    """A local source's files and what they are (ModelSourceError when neither can be had).
    Parts to `assemble` count as the file they make (its head is the first part's)."""
    offline = HubLocation(hub.cache_dir, offline=True)
    path = resolve_source(source, model_id=model_id, hub=offline)
    view = LocalView(path)
    parts = _first_parts(assemble, model_id, offline)
    stamp = _stamp(path) + tuple((name, _stamp(first)) for name, first in sorted(parts.items()))
    named_parts = tuple(sorted((name, str(first)) for name, first in parts.items()))
    return view, _detect_cached(str(path), stamp, named_parts, f"model '{model_id}' ({path})")


@functools.lru_cache(maxsize=64)
def _hub_inspection(source: str, access: HubAccess, model_id: str) -> tuple[HubView, Detected]:
    """Cached per reference and hub access for the process's life: each look costs the hub
    a listing and a ranged GET."""
    ref = hub_reference(source, model_id)
    try:
        view = HubView(ref, access)
    except ModelSourceError as exc:
        raise ModelSourceError(f"model '{model_id}': {exc.message}") from None
    return view, detect(view, label=f"model '{model_id}' ({ref})", selected=hub_selected(ref, view.names()))


def hub_selected(ref: HubReference, names: Sequence[str]) -> str | None:
    """The one file of a repo that detection looks at: the file the reference names, or the
    GGUF its quant tag (or the default quant) picks in a repo of GGUF files; None: the repo
    as a whole (a Hugging Face folder, a CT2 model, a voice)."""
    if ref.filename is not None:
        return ref.filename
    ggufs = [n for n in names if n.lower().endswith(".gguf")]
    if not ggufs or (ref.quant is None and any(n.endswith((".safetensors", ".bin")) for n in names)):
        return None
    models = [n for n in files_for("llama_cpp", names, ref.selector) if not is_projector(n)]
    return models[0] if models else None


def resolved_options(detected: Detected, view: LocalView | None) -> dict[str, Any]:
    """Detected options, with file names (`mmproj`) made paths: on disk for a local view;
    for a hub repo, relative to the weights file's folder (the backend looks beside the
    model, wherever the hub put it)."""
    options = dict(detected.options)
    for name in detected.file_options:
        value = options.get(name)
        if not isinstance(value, str):
            continue
        if view is not None:
            options[name] = str(view.local_path(value))
        else:
            options[name] = posixpath.relpath(value, posixpath.dirname(detected.weights or "") or ".")
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
