"""Backend name → import path. Importing this module imports no engine."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from modelpool.backends.base import Backend
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.errors import ConfigError
from modelpool.tasks import Task

BACKENDS: Mapping[str, str] = {
    "llama_cpp": "modelpool.backends.llama_cpp.backend:LlamaCppBackend",
    "sentence_transformers": "modelpool.backends.sentence_transformers:SentenceTransformersBackend",
    "transformers": "modelpool.backends.transformers.backend:TransformersBackend",
    "faster_whisper": "modelpool.backends.faster_whisper:FasterWhisperBackend",
    "piper": "modelpool.backends.piper:PiperBackend",
    "llama_server": "modelpool.backends.managed.llama_server:LlamaServerBackend",
    "vllm_serve": "modelpool.backends.managed.vllm_serve:VllmServeBackend",
    "openai_remote": "modelpool.backends.remote.backend:OpenAIRemoteBackend",
}


class BackendClass(Protocol):
    """What a backend class offers before it is instantiated."""

    Options: type[BaseModel]
    supported_tasks: frozenset[Task]

    def __call__(self, model: ModelConfig, options: Any, hub: HubLocation) -> Backend: ...


def backend_class(name: str) -> BackendClass:
    try:
        module_name, _, attribute = BACKENDS[name].partition(":")
    except KeyError:
        raise ConfigError(f"unknown backend '{name}' (known: {', '.join(sorted(BACKENDS))})") from None
    cls: BackendClass = getattr(importlib.import_module(module_name), attribute)
    return cls


def model_tasks(model: ModelConfig) -> frozenset[Task]:
    """The tasks a model serves: what its config says, within what its backend can do.
    Unsaid, a backend may narrow its default by its options (`default_tasks(options)`):
    a llama-server started for embeddings does not chat."""
    cls = backend_class(model.backend)
    supported = cls.supported_tasks
    if model.tasks is None:
        default_tasks = getattr(cls, "default_tasks", None)
        return frozenset(default_tasks(parse_options(model))) if default_tasks else supported
    unsupported = set(model.tasks) - supported
    if unsupported:
        names = ", ".join(sorted(t.value for t in unsupported))
        raise ConfigError(f"model '{model.id}': backend '{model.backend}' cannot do {names}")
    return frozenset(model.tasks)


def parse_options(model: ModelConfig) -> BaseModel:
    """The model's backend options, validated by its backend; bad options fail before any loading."""
    cls = backend_class(model.backend)
    if model.source is None and getattr(cls, "needs_source", True):
        raise ConfigError(f"model '{model.id}': backend '{model.backend}' needs a `source` (where its weights are)")
    try:
        return cls.Options.model_validate(model.options)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"model '{model.id}': invalid options for backend '{model.backend}': {problems}") from None


def build_backend(model: ModelConfig, options: BaseModel, hub: HubLocation) -> Backend:
    """A not-yet-started backend for `model`."""
    return backend_class(model.backend)(model, options, hub)
