"""What vLLM's engine is told, shared by the two ways modelpool runs it: `vllm_serve` (its
OpenAI server as a process of its own) and `vllm` (its async engine inside modelpool). The
options mean the same in both, and both turn them into the same command-line flags: the
server parses them from its argv, the in-process engine through vLLM's own argument parser,
so a flag means exactly what `vllm serve` makes of it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field


class VllmEngineOptions(BaseModel):
    """The engine's settings (not how a process of it is run)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

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
    turns on `tool_choice: auto` (`--enable-auto-tool-choice --tool-call-parser`). vLLM 0.32
    needs it for named and required tool choices too; `response_format` works without it."""
    tool_strict_level: Literal["auto", "function", "parameter"] | None = None
    """How far vLLM's structured outputs constrain tool calls (`--tool-strict-level`):
    `auto` (vLLM's default) the call's envelope by the tool choice, the arguments only for
    tools sent with `strict: true`; `function` the envelope always; `parameter` also every
    call's arguments to its tool's JSON schema."""


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
    argv += ["--tool-strict-level", o.tool_strict_level] if o.tool_strict_level else []
    return argv


def default_engine_concurrency(options: VllmEngineOptions) -> int:
    """Requests one engine runs at once: `max_num_seqs`, or vLLM's own default (256)."""
    return options.max_num_seqs or 256


def images_per_prompt(options: VllmEngineOptions) -> int:
    """Images one prompt may carry (0: the model is read as text-only)."""
    return (options.limit_mm_per_prompt or {}).get("image", 0)
