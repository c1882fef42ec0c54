"""LoRA adapters of the transformers engine, through PEFT.

The first adapter loaded wraps the model with PEFT (its LoRA layers go into the model's
own modules, in place); later ones are added beside it (`load_adapter`). Every forward of
the engine then names each row's adapter (`adapter_names`, "__base__" for the base
model), so rows of different adapters and of the base model run in ONE forward: each LoRA
layer runs the base weights over the whole batch and adds each adapter's update to its
own rows (PEFT's mixed-batch path). At most `max_adapters` are held; one more deletes the
least recently used adapter that no sequence in the engine uses. The engine thread owns
everything here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpool.backends.adapter_places import AdapterPlaces
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation, files_size, resolve_source
from modelpool.errors import AdapterNotFound, ModelLoadFailed
from modelpool.quiet_warnings import ignoring

BASE = "__base__"
"""PEFT's name for rows that run without an adapter."""


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter a request asks for: its name, its PEFT folder (resolved) and its scale."""

    name: str
    folder: str
    scale: float


@dataclass(frozen=True)
class HeldAdapter:
    spec: AdapterSpec
    bytes: int
    """What its LoRA tensors take."""


class PeftAdapters(AdapterPlaces[AdapterSpec, HeldAdapter]):
    """The adapters loaded into one model, least recently used first."""

    def __init__(self, model: Any, *, max_adapters: int, model_id: str) -> None:
        super().__init__(max_adapters=max_adapters, model_id=model_id)
        self._model = model
        self._peft: Any = None
        """The PeftModel around `_model` (None until the first adapter loads)."""

    @property
    def loaded(self) -> list[str]:
        """The loaded adapters' names (safe from any thread: a snapshot)."""
        return [held.spec.name for held in self.held]

    @contextlib.contextmanager
    def rows(self, names: list[str | None]) -> Iterator[None]:
        """Forwards inside run row i with adapter names[i] (None: the base model)."""
        if self._peft is None:  # nothing loaded yet: every row is the base model
            yield
            return
        with self._peft.base_model._enable_peft_forward_hooks(adapter_names=[n or BASE for n in names]):
            yield

    def _load(self, spec: AdapterSpec) -> HeldAdapter:
        try:
            # PEFT 0.21 asks transformers 5 a deprecated question on wrapping (a FutureWarning).
            with ignoring(FutureWarning, "`is_gradient_checkpointing` is deprecated"):
                if self._peft is None:
                    self._peft = _wrap(self._model, spec)
                self._peft.load_adapter(spec.folder, adapter_name=spec.name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            self._discard_partial(spec.name)
            raise ModelLoadFailed(f"model '{self._model_id}': PEFT could not load adapter '{spec.name}' "
                                  f"(is it a PEFT LoRA adapter made for this model?): {exc}") from exc  # fmt: skip
        return HeldAdapter(spec, self._scale(spec))

    def _discard_partial(self, name: str) -> None:
        """Take out what a failed load put into the model: PEFT injects an adapter's LoRA layers
        (active) before it loads their weights, so a half-loaded adapter would otherwise change
        every row, the base model's too. With no other adapter loaded, the model is unwrapped
        to its original modules."""
        if self._peft is None:
            return
        if not self._loaded:
            self._peft.unload()  # puts every wrapped module's base layer back in its place
            self._peft = None
        elif name in self._peft.peft_config:
            self._peft.delete_adapter(name)

    def _scale(self, spec: AdapterSpec) -> int:
        """Apply the configured scale to every LoRA layer of the adapter; the bytes its tensors take."""
        from peft.tuners.lora import LoraLayer

        size = 0
        for module in self._model.modules():
            if isinstance(module, LoraLayer) and spec.name in module.lora_A:
                module.set_scale(spec.name, spec.scale)
                for part in (module.lora_A[spec.name], module.lora_B[spec.name]):
                    size += sum(p.numel() * p.element_size() for p in part.parameters())
        return size

    def _free(self, held: HeldAdapter) -> None:
        self._peft.delete_adapter(held.spec.name)

    def _spec_of(self, held: HeldAdapter) -> AdapterSpec:
        return held.spec

    def _bytes_of(self, held: HeldAdapter) -> int:
        return held.bytes


def _wrap(model: Any, spec: AdapterSpec) -> Any:
    """`model` wrapped by PEFT with the adapter's config and its LoRA layers injected (weights
    not loaded yet): PeftModel.from_pretrained's first step, done here so a failed weight
    load still leaves a PeftModel to unload."""
    from peft import MODEL_TYPE_TO_PEFT_MODEL_MAPPING, PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(spec.folder)
    config.inference_mode = True
    wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type or "", PeftModel)
    return wrapper(model, config, adapter_name=spec.name)


class AdapterFolders:
    """A model's configured adapters, their sources resolved to PEFT folders once (an `hf:`
    source may download: callers run `spec` off the event loop)."""

    def __init__(self, model: ModelConfig, hub: HubLocation) -> None:
        self._model, self._hub = model, hub
        self._specs: dict[str, AdapterSpec] = {}

    def spec(self, name: str) -> AdapterSpec:
        spec = self._specs.get(name)
        if spec is None:
            adapter = self._model.adapters.get(name)
            if adapter is None:  # the pool checks names first; this keeps any other path honest
                raise AdapterNotFound(f"model '{self._model.id}' has no adapter '{name}'", param="adapter")
            path = resolve_source(adapter.source, model_id=self._model.id, hub=self._hub, backend="transformers")
            folder = path.parent if path.is_file() else path  # a path to its adapter_model.safetensors
            spec = self._specs[name] = AdapterSpec(name, str(folder), adapter.scale)
        return spec

    def adapted_modules(self) -> Callable[[str], bool] | None:
        """Whether a module of the model (by qualified name) is one some declared adapter wraps
        (a LoRA target, or a module it saves whole), by PEFT's own matching: those stay plain
        `nn.Linear` for PEFT, the rest may be packed. None: that cannot be told before the
        adapters load (`all-linear`, target parameters), so nothing may be packed."""
        from peft import PeftConfig
        from peft.tuners.tuners_utils import check_target_module_exists

        configs = [PeftConfig.from_pretrained(self.spec(name).folder) for name in self._model.adapters]
        for config in configs:
            targets = getattr(config, "target_modules", None)
            if targets is None or targets == "all-linear" or getattr(config, "target_parameters", None):
                return None

        def adapted(key: str) -> bool:
            for config in configs:
                saved = getattr(config, "modules_to_save", None) or []
                whole = any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in saved)
                if whole or check_target_module_exists(config, key):
                    return True
            return False

        return adapted

    def preloaded(self) -> list[AdapterSpec]:
        return [self.spec(name) for name, adapter in self._model.adapters.items() if adapter.preload]

    def largest_bytes(self) -> int:
        """The most memory the adapters may add at once: the `max_adapters` largest weight files."""
        sizes = sorted((_weights_bytes(Path(self.spec(name).folder)) for name in self._model.adapters), reverse=True)
        return sum(sizes[: self._model.max_adapters])


def _weights_bytes(folder: Path) -> int:
    weights = [p for p in folder.glob("adapter_model.*") if p.is_file()]
    return sum(files_size(p) for p in weights) if weights else files_size(folder)
