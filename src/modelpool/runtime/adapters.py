"""Which LoRA adapter a request runs with: `model: "base:adapter"` (as vLLM and llama-server
users write it) or the request's own `adapter` field, checked against the model's
`adapters:` before any work starts, so an unknown adapter is a 400 naming it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from modelpool.backends.base import AdapterBackend, implements
from modelpool.errors import AdapterNotFound, InvalidRequest, ModelNotLoaded

if TYPE_CHECKING:
    from modelpool.runtime.slot import ModelSlot


def split_adapter(names: Mapping[str, ModelSlot], name: str, asked: str | None) -> tuple[str, str | None]:
    """(the model's name, the adapter or None). A name some model has (an id or alias with
    a `:` in it) is that model: an exact match wins over `base:adapter`."""
    adapter = None
    if name not in names and ":" in name:
        base, _, suffix = name.rpartition(":")
        if base in names:
            name, adapter = base, suffix
    if asked is not None:
        if adapter is not None and asked != adapter:
            raise InvalidRequest(f"`model` names adapter '{adapter}' but `adapter` says '{asked}'", param="adapter")
        adapter = asked
    slot = names.get(name)
    if adapter is not None and slot is not None and adapter not in slot.config.adapters:
        known = ", ".join(sorted(slot.config.adapters)) or "none"
        raise AdapterNotFound(f"model '{slot.id}' has no adapter '{adapter}' (it has: {known})", param="adapter")
    return name, adapter


def adapter_backends(slot: ModelSlot) -> list[AdapterBackend]:
    """The running replicas' backends, for an admin's adapter load or unload: the model must
    be loaded (an adapter loads into a running engine) and its backend able to."""
    if not slot.capabilities.declared.adapters:
        raise InvalidRequest(f"backend '{slot.config.backend}' of model '{slot.id}' serves no adapters", param="model")
    backends = [r.backend for r in slot.replicas.routable() if r.backend is not None]
    if not backends:
        raise ModelNotLoaded(f"model '{slot.id}' is not loaded: load it, then its adapters")
    able = [b for b in backends if implements(b, AdapterBackend)]
    if len(able) != len(backends):
        raise InvalidRequest(f"backend '{slot.config.backend}' loads its adapters at start only "
                             "(every declared adapter is served)", param="model")  # fmt: skip
    return able


def loaded_adapters(slot: ModelSlot) -> list[str]:
    """The adapters the first running replica holds (none when not loaded)."""
    for replica in slot.replicas.routable():
        if implements(replica.backend, AdapterBackend):
            return replica.backend.loaded_adapters()
    return []


def adapter_bytes(slot: ModelSlot) -> int:
    """What the adapters of all its running replicas take (the memory report)."""
    held = [r.backend for r in slot.replicas.routable() if implements(r.backend, AdapterBackend)]
    return sum(backend.adapter_bytes() for backend in held)
