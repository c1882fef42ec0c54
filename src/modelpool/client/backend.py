"""The agent sample's backend switch, worker side: one `model_backend` key in the worker's
YAML picks its models file. `local` (the default) reads the file its `models_yaml` key
names (default `models.yaml`); `nim` reads the hosted overlay `models.nim.yaml`; any other
backend `B` reads `models.B.yaml`. Paths are relative to the worker's YAML. The launcher
reads the same key (a stack's `model_backend_file`) to skip the services it replaces."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from modelpool.client.config import ModelsConfig, load_models_config
from modelpool.client.errors import ConfigError

LOCAL = "local"
_BACKEND = re.compile(r"[A-Za-z0-9_-]{1,32}")


def models_file_of(worker_config: str | Path) -> Path:
    """The models file the worker config's `model_backend` selects (see the module docstring)."""
    path = Path(worker_config)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read worker config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"worker config {path} is not UTF-8 text") from None
    if not isinstance(data, dict):
        raise ConfigError(f"worker config {path} must hold a mapping")
    backend = str(data.get("model_backend", LOCAL)).lower()
    if not _BACKEND.fullmatch(backend):
        raise ConfigError(f"{path}: model_backend {backend[:40]!r} may hold only letters, digits, '_' and '-'")
    name = str(data.get("models_yaml", "models.yaml")) if backend == LOCAL else f"models.{backend}.yaml"
    return path.parent / name


def load_worker_models(worker_config: str | Path) -> ModelsConfig:
    """load_models_config on the file the worker config selects."""
    return load_models_config(models_file_of(worker_config))
