"""LoRA adapters of the in-process llama.cpp engine (llama.cpp's adapter API).

An adapter is loaded against the model (`llama_adapter_lora_init`) and applied to the
context as a whole (`llama_set_adapters_lora`): every row of one `llama_decode` runs with
the same adapters, so the engine decodes the rows of each adapter in a call of its own
(llama-server never batches slots with different LoRA settings either). Adapters are
loaded on the engine thread when the first request naming one is admitted, at most
`max_adapters` at once; one more unloads the least recently used adapter that no running
sequence uses. The engine thread owns everything here.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from modelpool.backends.adapter_places import AdapterPlaces
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation, resolve_source
from modelpool.errors import AdapterNotFound, ModelLoadFailed


@dataclass(frozen=True)
class AdapterSpec:
    """What a request asks: the adapter's name, its file (resolved by the backend) and scale."""

    name: str
    path: str
    scale: float


class LoadedAdapter:
    def __init__(self, spec: AdapterSpec, handle: Any) -> None:
        self.spec = spec
        self.handle = handle
        self.bytes = os.path.getsize(spec.path)
        """Its file's size: what it adds to the model's memory (the tensors are the file's bulk)."""


class AdapterCache(AdapterPlaces[AdapterSpec, LoadedAdapter]):
    """The adapters loaded for one model, least recently used first, and the one the context applies."""

    def __init__(self, llama: Any, model: Any, context: Any, *, max_adapters: int, model_id: str) -> None:
        super().__init__(max_adapters=max_adapters, model_id=model_id)
        self._llama, self._model, self._context = llama, model, context
        self._applied: LoadedAdapter | None = None

    @property
    def loaded(self) -> list[LoadedAdapter]:
        """The loaded adapters (safe from any thread: a snapshot)."""
        return self.held

    def can_take(self, spec: AdapterSpec, in_use: Callable[[], Iterable[str]]) -> bool:
        """Whether a sequence with `spec` may start now: its adapter is loaded, or there is
        room, or an idle adapter can make room."""
        if spec.name in self._loaded or len(self._loaded) < self.max_adapters:
            return True
        busy = set(in_use())
        return any(name not in busy for name in self._loaded)

    def apply(self, adapter: LoadedAdapter | None) -> None:
        """Set the context's adapters for the next decode (nothing to do if they are already set)."""
        if adapter is self._applied:
            return
        if adapter is None:
            status = self._llama.llama_set_adapters_lora(self._context, None, 0, None)
        else:
            handles = (self._llama.llama_adapter_lora_p_ctypes * 1)(adapter.handle)
            scales = (ctypes.c_float * 1)(adapter.spec.scale)
            status = self._llama.llama_set_adapters_lora(self._context, handles, 1, scales)
        if status != 0:
            raise ModelLoadFailed(f"model '{self._model_id}': llama.cpp could not set LoRA adapters ({status})")
        self._applied = adapter

    def _load(self, spec: AdapterSpec) -> LoadedAdapter:
        handle = self._llama.llama_adapter_lora_init(self._model, spec.path.encode("utf-8"))
        if not handle:
            raise ModelLoadFailed(f"model '{self._model_id}': llama.cpp could not load adapter "
                                  f"'{spec.name}' (is it a LoRA GGUF made for this model?)")  # fmt: skip
        return LoadedAdapter(spec, handle)

    def _free(self, adapter: LoadedAdapter) -> None:
        if adapter is self._applied:
            self.apply(None)
        self._llama.llama_adapter_lora_free(adapter.handle)

    def _spec_of(self, adapter: LoadedAdapter) -> AdapterSpec:
        return adapter.spec

    def _bytes_of(self, adapter: LoadedAdapter) -> int:
        return adapter.bytes


class AdapterSources:
    """A model's configured adapters, their sources resolved to files once (an `hf:` source
    may download: callers run `spec` off the event loop)."""

    def __init__(self, model: ModelConfig, hub: HubLocation) -> None:
        self._model, self._hub = model, hub
        self._specs: dict[str, AdapterSpec] = {}

    def spec(self, name: str) -> AdapterSpec:
        spec = self._specs.get(name)
        if spec is None:
            adapter = self._model.adapters.get(name)
            if adapter is None:  # the pool checks names first; this keeps any other path honest
                raise AdapterNotFound(f"model '{self._model.id}' has no adapter '{name}'", param="adapter")
            path = resolve_source(adapter.source, model_id=self._model.id, hub=self._hub, backend="llama_cpp")
            spec = self._specs[name] = AdapterSpec(name, str(path), adapter.scale)
        return spec

    def preloaded(self) -> list[AdapterSpec]:
        return [self.spec(name) for name, adapter in self._model.adapters.items() if adapter.preload]

    def largest_bytes(self) -> int:
        """The most memory the adapters may add at once: the `max_adapters` largest files."""
        sizes = sorted((os.path.getsize(self.spec(name).path) for name in self._model.adapters), reverse=True)
        return sum(sizes[: self._model.max_adapters])
