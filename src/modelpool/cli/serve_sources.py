"""`modelpool serve MODEL…`: models named on the command line — a file or folder on disk, an
`hf:` reference (or `org/repo…` without the prefix), or a catalog id — become config
entries with no `backend`, which the loader then detects from their files.

What is served: the named models, plus what a config file (`--config`, MODELPOOL_CONFIG)
or `--models` serves on its own when one is given. Without either, the named models are
the whole catalog and the starter models are not served unless named: someone who types
`modelpool serve ./my.gguf` wants that model, not eight more beside it (four preloading,
~2 GB, holding ids and the `whisper-1`/`tts-1` aliases); `modelpool serve ./my.gguf
smollm2` serves a starter too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from modelpool.config.schema import Config
from modelpool.errors import ConfigError, ModelSourceError
from modelpool.hub.reference import looks_like_reference, parse_reference

MAX_MODELS = 64
"""Models one command line may name."""
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9._+-]+")
_WEIGHT_SUFFIXES = (".gguf", ".onnx")


@dataclass(frozen=True)
class Named:
    """One model named on the command line."""

    id: str
    entry: Mapping[str, Any] | None
    """The config entry it makes (a `source`, no backend); None for a catalog id."""


def named_models(
    args: Sequence[str], names: Sequence[str], catalog: Mapping[str, Sequence[str]], *, keep_catalog: bool
) -> list[Named]:
    """Each argument as a model. `catalog` maps every catalog id to its aliases: an argument
    that is one of them (and no path on disk) serves that entry. `names` (`--name`) give the
    ids in order; the rest default to a slug of the file, folder or repo name. An id may not
    take a catalog name when the catalog is kept (`keep_catalog`), nor repeat."""
    if len(args) > MAX_MODELS:
        raise ConfigError(f"at most {MAX_MODELS} models on one command line ({len(args)} given)")
    if len(names) > len(args):
        raise ConfigError(f"{len(names)} --name given for {len(args)} models: one --name per model, in order")
    known = {name: model_id for model_id, aliases in catalog.items() for name in (model_id, *aliases)}
    named: list[Named] = []
    for index, arg in enumerate(args):
        if arg in known and index >= len(names) and not Path(arg).exists():
            named.append(Named(known[arg], None))
            continue
        source = source_of(arg)  # first: a bad reference is refused before its id is made
        model_id = names[index] if index < len(names) else slug(arg)
        if (keep_catalog and model_id in known) or any(n.id == model_id for n in named):
            raise ConfigError(f"model id '{model_id}' (for {arg}) is already taken: give it another with --name")
        named.append(Named(model_id, {"source": source}))
    return named


def source_of(arg: str) -> str:
    """A `source` for the config: an absolute path, or an `hf:` reference."""
    if looks_like_reference(arg):
        try:
            return str(parse_reference(arg))
        except ModelSourceError as exc:
            raise ConfigError(exc.message) from None
    path = Path(arg).expanduser()
    if not path.exists():
        raise ConfigError(f"{arg}: no such file or folder, and not a model id or an hf:org/repo reference")
    return str(path.resolve())


def slug(arg: str) -> str:
    """The default id: the file's name without its weights suffix, the folder's name, or
    the repo's name (with its quant tag or file)."""
    if looks_like_reference(arg):
        reference = parse_reference(arg)
        base = reference.repo_id.split("/", 1)[1]
        chosen = reference.quant or (_stem(PurePosixPath(reference.filename).name) if reference.filename else None)
        text = f"{base}-{chosen}" if chosen and chosen.lower() not in base.lower() else base
    else:
        path = Path(arg).expanduser().resolve()
        text = _stem(path.name) if path.is_file() else path.name
    cleaned = _NOT_IN_ID.sub("-", text).strip("-._+")
    return cleaned or "model"


def _stem(name: str) -> str:
    lowered = name.lower()
    for suffix in _WEIGHT_SUFFIXES:
        if lowered.endswith(suffix):
            return name[: -len(suffix)]
    return name


def serve_overrides(
    args: Sequence[str], names: Sequence[str], base: Config, overrides: Mapping[str, Any], *, config_file: bool
) -> dict[str, Any]:
    """The CLI layer for `serve MODEL…`. With a config file (or `--models`), the named models
    join what `base` (the config without them) serves. Without one, they are the whole
    catalog: the starter models are left out (a named one is copied in), so they neither
    load nor hold ids and aliases a named model may want."""
    keep = config_file or "enabled_models" in overrides
    named = named_models(args, names, {m.id: m.aliases for m in base.models.values()}, keep_catalog=keep)
    if keep:
        entries = {n.id: dict(n.entry) for n in named if n.entry is not None}
        served = [m.id for m in base.served_models()]
        return {
            **overrides,
            "models": entries,
            "enabled_models": list(dict.fromkeys([*served, *(n.id for n in named)])),
        }
    entries = {n.id: dict(n.entry) if n.entry is not None else _entry_of(base, n.id) for n in named}
    return {**overrides, "starter_models": False, "models": entries, "enabled_models": list(entries)}


def _entry_of(base: Config, model_id: str) -> dict[str, Any]:
    """A catalog entry as a config layer would write it (its id is its key)."""
    return base.models[model_id].model_dump(mode="json", exclude={"id"}, exclude_defaults=True)
