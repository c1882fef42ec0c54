"""Backend name → import path, and the one rule that turns a model's config and its backend's
declaration into what the model does. Importing this module imports no engine."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from modelpool.backends.base import Backend, BackendClass
from modelpool.backends.context import BackendContext
from modelpool.capabilities import ModelCapabilities
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError
from modelpool.tasks import Task

BACKENDS: Mapping[str, str] = {
    "llama_cpp": "modelpool.backends.llama_cpp.backend:LlamaCppBackend",
    "sentence_transformers": "modelpool.backends.sentence_transformers:SentenceTransformersBackend",
    "cross_encoder": "modelpool.backends.cross_encoder:CrossEncoderBackend",
    "transformers": "modelpool.backends.transformers.backend:TransformersBackend",
    "ctranslate2": "modelpool.backends.ctranslate2.backend:CTranslate2Backend",
    "faster_whisper": "modelpool.backends.faster_whisper:FasterWhisperBackend",
    "piper": "modelpool.backends.piper:PiperBackend",
    "kokoro": "modelpool.backends.kokoro:KokoroBackend",
    "llama_server": "modelpool.backends.managed.llama_server:LlamaServerBackend",
    "vllm_serve": "modelpool.backends.managed.vllm_serve:VllmServeBackend",
    "vllm": "modelpool.backends.vllm.backend:VllmBackend",
    "openai_remote": "modelpool.backends.remote.backend:OpenAIRemoteBackend",
}


def backend_class(name: str) -> BackendClass:
    """A built-in backend by name, or your own by import path (`package.module:Class`)."""
    path = BACKENDS.get(name) or (name if ":" in name else None)
    if path is None:
        raise ConfigError(f"unknown backend '{name}' (known: {', '.join(sorted(BACKENDS))}, or `module:Class`)")
    module_name, _, attribute = path.partition(":")
    try:
        cls: BackendClass = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"backend '{name}' cannot be imported: {exc}") from None
    return cls


def model_capabilities(model: ModelConfig) -> ModelCapabilities:
    """What `model` does: its backend's capabilities narrowed by its options, and the tasks
    its config asks for (which must be within them) or else the backend's default."""
    cls = backend_class(model.backend)
    declared = cls.capabilities_for(parse_options(model))
    asked = frozenset(model.tasks) if model.tasks is not None else None
    unsupported = (asked or frozenset()) - declared.tasks
    if unsupported:
        names = ", ".join(sorted(t.value for t in unsupported))
        raise ConfigError(f"model '{model.id}': backend '{model.backend}' cannot do {names}")
    tasks = declared.served_tasks(asked)
    if Task.TRANSCRIPTION in tasks and declared.audio_input_rate is None:
        raise ConfigError(f"backend '{model.backend}' declares transcription but no `audio_input_rate`")
    if model.adapters and not declared.adapters:
        raise ConfigError(f"model '{model.id}': backend '{model.backend}' cannot serve LoRA adapters "
                          f"(adapters: {', '.join(model.adapters)})")  # fmt: skip
    splits = model.reasoning_parser is not None or declared.thinking_in_template
    thinking = ("default", "enabled", "disabled") if splits and Task.CHAT in tasks else ()
    if model.enable_thinking is not None and Task.CHAT not in tasks:
        raise ConfigError(f"model '{model.id}': enable_thinking is set, but the model does not chat")
    return ModelCapabilities(
        tasks, declared, thinking_modes=thinking, overridable=cls.overridable, thinking_default=model.enable_thinking
    )


def parse_options(model: ModelConfig) -> BaseModel:
    """The model's backend options, validated by its backend; bad options fail before any loading."""
    cls = backend_class(model.backend)
    if model.source is None and cls.capabilities.needs_source:
        raise ConfigError(f"model '{model.id}': backend '{model.backend}' needs a `source` (where its weights are)")
    try:
        return cls.Options.model_validate(model.options)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"model '{model.id}': invalid options for backend '{model.backend}': {problems}") from None


def build_backend(model: ModelConfig, context: BackendContext) -> Backend:
    """A not-yet-started backend for `model` (its options validated again: overrides may have changed them)."""
    return backend_class(model.backend)(model, parse_options(model), context)
