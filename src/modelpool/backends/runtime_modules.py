"""The runtimes each built-in backend imports before it loads anything: the libraries whose
first import costs memory once per process, however many models share them. The pool
imports them first, alone, and counts that memory apart as the runtime's (docs/memory.md),
so no model is charged for torch. Shared ones come first so that, for instance,
sentence-transformers is counted without the torch it imports."""

from __future__ import annotations

from collections.abc import Mapping

_TORCH = ("torch", "transformers")
RUNTIME_MODULES: Mapping[str, tuple[str, ...]] = {
    "llama_cpp": ("llama_cpp",),
    "sentence_transformers": (*_TORCH, "sentence_transformers"),
    "cross_encoder": (*_TORCH, "sentence_transformers"),
    "transformers": _TORCH,
    "ctranslate2": ("ctranslate2", "transformers"),
    "faster_whisper": ("ctranslate2", "faster_whisper"),
    "piper": ("onnxruntime", "piper"),
    "kokoro": ("onnxruntime", "kokoro_onnx"),
    # vLLM's API side (torch with it) lives in modelpool, its engine core in a child process.
    # torch is not named: that would start a CUDA context in modelpool, which vLLM leaves to its core.
    "vllm": ("vllm.v1.engine.async_llm",),
}
"""Backend name → modules in import order. Engines in processes of their own, remote ones
and your own backend classes import nothing shared here: none are listed."""


KNOWN_RUNTIMES: tuple[str, ...] = tuple(dict.fromkeys(m for modules in RUNTIME_MODULES.values() for m in modules))
"""Every runtime above once, shared ones first."""


def runtime_modules(backend: str) -> tuple[str, ...]:
    return RUNTIME_MODULES.get(backend, ())
