"""The places of a model's loaded LoRA adapters, least recently used first: what the engines
with adapters in process (llama.cpp, transformers with PEFT) share. At most `max_adapters`
are held; one more unloads the least recently used adapter no running sequence uses, and
with every place in use the caller waits (Overloaded). The engine thread owns it; the
memory report reads a snapshot from the event loop's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from modelpool.errors import Overloaded


class NamedSpec(Protocol):
    @property
    def name(self) -> str: ...


Spec = TypeVar("Spec", bound=NamedSpec)
Held = TypeVar("Held")


class AdapterPlaces(ABC, Generic[Spec, Held]):
    def __init__(self, *, max_adapters: int, model_id: str) -> None:
        self.max_adapters = max_adapters
        self._model_id = model_id
        self._loaded: OrderedDict[str, Held] = OrderedDict()
        self.loads = self.evictions = 0
        self._snapshot: tuple[tuple[Held, ...], int] = ((), 0)

    @abstractmethod
    def _load(self, spec: Spec) -> Held:
        """Load the adapter into the engine (raise ModelLoadFailed, leaving nothing behind)."""

    @abstractmethod
    def _free(self, held: Held) -> None:
        """Take a loaded adapter out of the engine."""

    @abstractmethod
    def _spec_of(self, held: Held) -> Spec: ...

    @abstractmethod
    def _bytes_of(self, held: Held) -> int:
        """What the adapter adds to the model's memory."""

    @property
    def held(self) -> list[Held]:
        """The loaded adapters, least recently used first (safe from any thread: a snapshot)."""
        return list(self._snapshot[0])

    def total_bytes(self) -> int:
        """What the loaded adapters add to the model's memory (safe from any thread: a snapshot)."""
        return self._snapshot[1]

    def acquire(self, spec: Spec, in_use: Callable[[], Iterable[str]]) -> Held:
        """The adapter loaded and most recently used, an idle one unloaded if every place is taken."""
        held = self._loaded.get(spec.name)
        if held is not None and self._spec_of(held) == spec:
            self._loaded.move_to_end(spec.name)
            return held
        if held is not None:  # the same name from another file or scale (a reload): load anew
            self._drop(spec.name)
        busy = set(in_use()) if len(self._loaded) >= self.max_adapters else set()
        while len(self._loaded) >= self.max_adapters:
            idle = next((name for name in self._loaded if name not in busy), None)
            if idle is None:
                raise Overloaded(f"model '{self._model_id}': all {self.max_adapters} adapter places are in use")
            self._drop(idle)
            self.evictions += 1
        held = self._load(spec)
        self._loaded[spec.name] = held
        self.loads += 1
        self._publish()
        return held

    def unload(self, name: str, in_use: Callable[[], Iterable[str]]) -> bool:
        """Unload an adapter now (admin); False if it was not loaded; Overloaded while in use."""
        if name not in self._loaded:
            return False
        if name in set(in_use()):
            raise Overloaded(f"model '{self._model_id}': adapter '{name}' is in use by a running request")
        self._drop(name)
        return True

    def _drop(self, name: str) -> None:
        held = self._loaded.pop(name)
        self._publish()
        self._free(held)

    def _publish(self) -> None:
        """Refresh the snapshot: only the engine thread changes `_loaded`, and a reader on another
        thread iterating it could meet a change midway. One tuple assignment: readers see the
        old or the new whole."""
        values = tuple(self._loaded.values())
        self._snapshot = (values, sum(self._bytes_of(held) for held in values))
