"""Resolve the effective config once, from layers of increasing strength:

    defaults < config file < local override file < MODELPOOL_* env < CLI flags

(only the MODELPOOL_* variables that spell a config path: `env_paths.py`)

Mappings merge key by key (so a layer can change one field of one model); any other
value is replaced whole. The result is validated once by pydantic. This is the only
module that reads the environment (secrets aside, which backends read from the env var
that the config names).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from modelpool.config.detection import fill_detected
from modelpool.config.env_paths import config_path, unread_names
from modelpool.config.schema import Config
from modelpool.config.sources import HubLocation
from modelpool.errors import ConfigError

ENV_CONFIG_FILE = "MODELPOOL_CONFIG"
ENV_LOCAL_FILE = "MODELPOOL_LOCAL_CONFIG"
MAX_CONFIG_BYTES = 8 * 1024**2
"""The largest config file read: one far larger is a mistake (or an attack on a reload)."""
MAX_CONFIG_VALUES = 1_000_000
"""The most values (mappings, lists, scalars) one config file may expand to."""
log = logging.getLogger("modelpool.config")


def load_config(
    config_file: Path | None = None,
    *,
    local_file: Path | None = None,
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the effective config. Raises ConfigError with every problem spelled out."""
    env = os.environ if environ is None else environ
    config_file = config_file or _path_from_env(env, ENV_CONFIG_FILE)
    local_file = local_file or _path_from_env(env, ENV_LOCAL_FILE) or _sibling_local_file(config_file)
    files = deep_merge(
        _read_file_layer(config_file) if config_file else {},
        _read_file_layer(local_file) if local_file else {},
    )
    catalog_ids = [*starter_catalog(), *(files.get("models") or {}), *(dict(cli or {}).get("models") or {})]
    merged = deep_merge(deep_merge(files, env_layer(env, catalog_ids)), dict(cli or {}))
    if merged.get("starter_models", True) not in (False, "false", "0", 0):
        merged["models"] = deep_merge(starter_catalog(), merged.get("models") or {})
    return validate_config(with_detected_backends(merged))


def config_files(
    config_file: Path | None = None, *, local_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path, ...]:
    """The files `load_config` reads with these arguments: the config file and its local
    override — the sibling `.local` file even before it exists (a watch sees it appear)."""
    env = os.environ if environ is None else environ
    config_file = config_file or _path_from_env(env, ENV_CONFIG_FILE)
    if config_file is None:
        return ()
    local_file = local_file or _path_from_env(env, ENV_LOCAL_FILE) or _sibling_name(config_file)
    return (config_file, local_file)


def with_detected_backends(merged: dict[str, Any]) -> dict[str, Any]:
    """Entries that name no `backend` get it (and tasks, options) from their files."""
    models = merged.get("models")
    if not isinstance(models, Mapping):
        return merged
    cache = merged.get("hf_cache_dir")
    offline = merged.get("offline") in (True, "true", "1", 1)
    hub = HubLocation(Path(cache).expanduser() if isinstance(cache, str) and cache else None, offline=offline)
    return {**merged, "models": fill_detected(models, hub)}


def validate_config(data: Mapping[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {validation_problems(exc)}") from None


def validation_problems(exc: ValidationError) -> str:
    """Each problem as `dotted.path: message`, joined: what a user can act on."""
    return "; ".join(f"{_dotted(e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors())


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` wins; nested mappings merge instead of replacing each other."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def env_layer(environ: Mapping[str, str], model_ids: Iterable[str] = ()) -> dict[str, Any]:
    """`MODELPOOL_SERVER__PORT=9000` → `{"server": {"port": 9000}}`: only variables that
    spell a real config path (`config/env_paths.py`; `model_ids` resolve the segment under
    `models`). Values are read as YAML scalars/flow collections, so `true`, `8000` and
    `[a, b]` arrive typed."""
    ids = list(model_ids)
    layer: dict[str, Any] = {}
    for name, raw in environ.items():
        path = config_path(name, ids)
        if path:
            layer = deep_merge(layer, _nest(path, _parse_env_value(raw)))
    unread = unread_names(environ)
    if unread:  # names only: a value may be a secret (MODELPOOL_APP_KEY)
        log.debug("ignoring environment variables that are no config path: %s", ", ".join(unread))
    return layer


def unread_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """The `MODELPOOL_*` variables the loader leaves alone (names only), for `serve` to log
    once logging is set up: at load time no handler shows a debug line yet."""
    return unread_names(os.environ if environ is None else environ)


def starter_catalog() -> dict[str, Any]:
    """The built-in catalog of models that ship inside PyPI packages."""
    text = resources.files("modelpool.config").joinpath("starter_models.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ConfigError("the built-in starter catalog (starter_models.yaml) must hold a mapping at the top level")
    return data


def _read_file_layer(path: Path) -> dict[str, Any]:
    return _anchor_relative_sources(read_yaml_mapping(path), path.parent)


def read_yaml_mapping(path: Path, what: str = "config file") -> dict[str, Any]:
    """A YAML file holding a mapping (an empty file is an empty one), or a ConfigError that
    says which file and what is wrong with it."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{what} {path} is over {MAX_CONFIG_BYTES // 1024**2} MiB: not a config file")
        data = yaml.safe_load(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as exc:  # a folder, a file this user may not read
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a mapping at the top level")
    if not _within(data, MAX_CONFIG_VALUES):  # YAML aliases can make a small file a huge tree
        raise ConfigError(f"{what} {path} holds over {MAX_CONFIG_VALUES} values (with its aliases expanded)")
    return data


def _within(data: Any, budget: int) -> bool:
    """Whether `data` holds at most `budget` values, counting a shared (aliased) value at
    each use; stops as soon as it is over, so an alias bomb costs at most `budget` steps."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _anchor_relative_sources(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """A plain relative `source:` (or `assemble:` part) means relative to the file that says
    it, not to the cwd."""
    models = data.get("models")
    if not isinstance(models, dict):
        return data
    anchored = {}
    for key, entry in models.items():
        if isinstance(entry, dict) and "source" in entry:
            entry = {**entry, "source": _anchored(entry["source"], base)}
        if isinstance(entry, dict) and isinstance(entry.get("assemble"), dict):
            assemble = {name: [_anchored(p, base) for p in parts] if isinstance(parts, list) else parts
                        for name, parts in entry["assemble"].items()}  # fmt: skip
            entry = {**entry, "assemble": assemble}
        if isinstance(entry, dict) and isinstance(entry.get("adapters"), dict):
            entry = {**entry, "adapters": _anchored_adapters(entry["adapters"], base)}
        anchored[key] = entry
    return {**data, "models": anchored}


def _anchored_adapters(adapters: dict[str, Any], base: Path) -> dict[str, Any]:
    """An adapter given as a bare source, or as a mapping with `source:`, anchored like the model's."""
    anchored: dict[str, Any] = {}
    for name, adapter in adapters.items():
        if isinstance(adapter, str):
            adapter = {"source": adapter}
        if isinstance(adapter, dict) and "source" in adapter:
            adapter = {**adapter, "source": _anchored(adapter["source"], base)}
        anchored[name] = adapter
    return anchored


def _anchored(source: object, base: Path) -> object:
    if isinstance(source, str) and ":" not in source and not Path(source).expanduser().is_absolute():
        return str((base / source).resolve())
    return source


def _sibling_local_file(config_file: Path | None) -> Path | None:
    """`models.yaml` gets its overrides from `models.local.yaml` beside it, when present."""
    if config_file is None:
        return None
    candidate = _sibling_name(config_file)
    return candidate if candidate.is_file() else None


def _sibling_name(config_file: Path) -> Path:
    return config_file.with_name(f"{config_file.stem}.local{config_file.suffix or '.yaml'}")


def _path_from_env(environ: Mapping[str, str], name: str) -> Path | None:
    value = environ.get(name)
    return Path(value) if value else None


def _parse_env_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    """`["a", "b"], 1` → `{"a": {"b": 1}}`; `path` is not empty."""
    *parents, leaf = path
    nested: dict[str, Any] = {leaf: value}
    for key in reversed(parents):
        nested = {key: nested}
    return nested


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"
