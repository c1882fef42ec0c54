"""What `modelpool cache` lists: modelpool's work dir (models it converted or assembled)
and the Hugging Face cache entries of the catalog's `hf:` models, each with its size and
the models that use it.

Work dir entries are the folders one level inside its known kinds (`assembled/`, `ct2/`,
`gguf-to-hf/`, `kokoro/`); anything else there (the MCP transcript store, ...) is not a
cache and is never listed or removed. A work entry is "used by" a model when its name
carries the model's key, computed from its files as they are now: the assembled folder's
name (`config.assemble`), the GGUF's name, size and mtime for a conversion (as
`textgen.hf_convert` names it), the backend for Kokoro's files. Older builds of the same
model match no key: they show as unused, ready to remove.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from modelpool.config.assemble import assembled_name
from modelpool.config.schema import Config, ModelConfig
from modelpool.config.sources import HF_PREFIX, HubLocation, model_sources, resolve_source
from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.cache import cache_entries, folder_size, remove_entry
from modelpool.hub.reference import parse_reference

WORK_KINDS = ("assembled", "ct2", "gguf-to-hf", "kokoro")
CONVERTING = frozenset({"transformers", "ctranslate2"})
"""Backends that convert a GGUF into the work dir (`gguf-to-hf/`, then `ct2/`)."""
HUB, WORK = "hf:", "work:"


@dataclass(frozen=True)
class Entry:
    name: str
    """`hf:org/repo` or `work:<kind>/<folder>`: what `cache rm` takes."""
    path: Path
    size_bytes: int
    used_by: tuple[str, ...]


def work_dir(config: Config) -> Path:
    return (config.work_dir or HubLocation.work_dir).expanduser()


def hub_of(config: Config) -> HubAccess:
    return HubAccess.from_env(config.hf_cache_dir, offline=True)


def list_entries(config: Config, *, every_repo: bool = False) -> list[Entry]:
    """The work dir's entries, then the hub entries the catalog uses (every one with `every_repo`)."""
    return _work_entries(config) + _hub_entries(config, every_repo=every_repo)


def entries_of_model(config: Config, model_id: str) -> list[Entry]:
    return [e for e in list_entries(config) if model_id in e.used_by]


def remove(config: Config, name: str) -> Entry:
    """Delete one entry by its listed name; nothing outside the work dir's kinds or the hub cache."""
    if name.startswith(HUB):
        gone = remove_entry(hub_of(config), name[len(HUB) :])
        return Entry(name, gone.path, gone.size_bytes, ())
    kind, _, folder = name.removeprefix(WORK).partition("/")
    if not name.startswith(WORK) or kind not in WORK_KINDS or not _plain(folder):
        raise ModelSourceError(
            f"'{name}' is not a cache entry (`modelpool cache ls` lists them: hf:org/repo, work:KIND/NAME)"
        )
    root = (work_dir(config) / kind).resolve()
    path = root / folder
    if path.is_symlink() or not path.is_dir() or path.resolve().parent != root:
        raise ModelSourceError(f"no cache entry {name} in {root}")
    entry = Entry(name, path, folder_size(path), ())
    shutil.rmtree(path)
    return entry


def _plain(folder: str) -> bool:
    return bool(folder) and "/" not in folder and "\\" not in folder and folder not in (".", "..")


def _work_entries(config: Config) -> list[Entry]:
    root = work_dir(config)
    keys = {model.id: _work_keys(model, config) for model in config.models.values()}
    entries = []
    for kind in WORK_KINDS:
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
            used = tuple(
                m for m, k in keys.items() if any(_carries(path.name, key) for its_kind, key in k if its_kind == kind)
            )
            entries.append(Entry(f"{WORK}{kind}/{path.name}", path, folder_size(path), used))
    return entries


def _carries(name: str, key: str) -> bool:
    return not key or name == key or name.startswith(key + "-")


def _work_keys(model: ModelConfig, config: Config) -> list[tuple[str, str]]:
    """(kind, name or name prefix) of this model's work entries, from its files as they are now
    ("" matches every entry of the kind)."""
    keys = []
    assembled = _assembled_name(model, config)
    if assembled is not None:
        keys.append(("assembled", assembled))
    if model.backend == "kokoro":
        keys.append(("kokoro", ""))
    gguf = _local(model, model.source, config) if model.backend in CONVERTING else None
    if gguf is not None and gguf.is_file() and gguf.suffix == ".gguf":
        stat = gguf.stat()
        converted = f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"
        keys.append(("gguf-to-hf", converted))
        if model.backend == "ctranslate2":
            keys.append(("ct2", converted))
    return keys


def _assembled_name(model: ModelConfig, config: Config) -> str | None:
    folder = _local(model, model.source, config)
    if not model.assemble or folder is None or not folder.is_dir():
        return None
    parts = {name: [_local(model, part, config) for part in its_parts] for name, its_parts in model.assemble.items()}
    if any(path is None for its_parts in parts.values() for path in its_parts):
        return None
    return assembled_name(model.id, folder, {n: [p for p in ps if p is not None] for n, ps in parts.items()})


def _local(model: ModelConfig, source: str | None, config: Config) -> Path | None:
    """Where a source is on this machine now, or None (never downloads)."""
    if source is None:
        return None
    hub = HubLocation(config.hf_cache_dir, offline=True)
    try:
        return resolve_source(source, model_id=model.id, hub=hub, backend=model.backend)
    except ModelSourceError:
        return None


def _hub_entries(config: Config, *, every_repo: bool) -> list[Entry]:
    users: dict[str, list[str]] = {}
    for model in config.models.values():
        for source in model_sources(model):
            if source.startswith(HF_PREFIX):
                try:
                    users.setdefault(parse_reference(source).repo_id, []).append(model.id)
                except ModelSourceError:
                    continue  # a bad reference fails where the model loads; not a cache entry
    return [
        Entry(f"{HUB}{e.repo_id}", e.path, e.size_bytes, tuple(users.get(e.repo_id, ())))
        for e in cache_entries(hub_of(config))
        if every_repo or e.repo_id in users
    ]
