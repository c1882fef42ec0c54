"""Engines are optional extras: a backend imports its engine only when it starts, and a
missing one fails the load with the pip command that brings it."""

from __future__ import annotations

import importlib

from modelpool.errors import ModelLoadFailed


def require_engine(model_id: str, modules: tuple[str, ...], extra: str) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ModelLoadFailed(f"model '{model_id}' needs {module}: pip install 'modelpool[{extra}]'") from exc
