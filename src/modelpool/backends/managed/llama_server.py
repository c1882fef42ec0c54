"""LlamaServerBackend: llama.cpp's `llama-server` binary, or llama-cpp-python's own server
(`python -m llama_cpp.server`) when no binary is configured, as a managed process."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from modelpool.backends.base import MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.gpu_estimates import llama_split
from modelpool.backends.llama_knobs import FlashAttention, KvCacheType, flash_attention_value, quantized_v_problem
from modelpool.backends.managed.base import MANAGED_CAPABILITIES, ManagedOptions, ManagedServerBackend
from modelpool.backends.managed.engine_flags import LLAMA_CPP_PYTHON, LLAMA_SERVER, configured_options
from modelpool.backends.managed.llama_server_knobs import (
    KNOBS,
    duplicate_problem,
    knob_argv,
    pairing_problem,
    runner_problem,
)
from modelpool.backends.managed.tokenizing import LlamaServerTokenizer
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, resolve_source
from modelpool.tasks import Task


class LlamaServerOptions(ManagedOptions):
    binary: str | None = None
    """Path of llama.cpp's `llama-server`. Default: llama-cpp-python's server, run by `python`."""
    python: str | None = None
    """Interpreter that runs `-m llama_cpp.server` (default: modelpool's own; in a container,
    the image's `python3`)."""
    context_length: int = Field(default=4096, ge=16, le=1 << 20)  # × parallel stays under 2**31
    """Context of one request in tokens. llama-server splits `-c` among its `-np` slots,
    so it gets `context_length × parallel` (`--n_ctx` for llama_cpp.server)."""
    gpu_layers: int = Field(default=0, ge=-1)
    """Layers offloaded to the GPU; -1: all (`-ngl` / `--n_gpu_layers`)."""
    parallel: int = Field(default=1, ge=1, le=256)
    """Requests the native server runs at once (`-np`); llama_cpp.server runs one."""
    mmproj: str | None = None
    """Multimodal projector file for vision models (`--mmproj` / `--clip_model_path`)."""
    max_images: int = Field(default=4, ge=1)
    """With `mmproj`: most images one request may carry (each costs the engine an encode
    and hundreds of context tokens)."""
    flash_attention: FlashAttention | None = None
    """Flash attention: `on`, `off` or `auto` (`-fa`; llama_cpp.server's `--flash_attn` takes
    on or off). Default: the engine's (llama-server: auto; llama_cpp.server: off)."""
    type_k: KvCacheType | None = None
    """KV-cache type of K (`-ctk` / `--type_k`): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl,
    q5_0, q5_1. Default: f16. A quantized type halves or quarters the cache."""
    type_v: KvCacheType | None = None
    """KV-cache type of V (`-ctv` / `--type_v`); a quantized one needs flash attention."""
    draft_model: str | None = None
    """llama-server only: a small GGUF of the same vocabulary that drafts tokens for the
    model to verify (speculative decoding, `-md`); a source like the model's own (a path,
    `hf:org/repo`). Only the config sets it."""
    draft_max_tokens: int | None = Field(default=None, ge=1, le=128)
    """With `draft_model`: most tokens drafted per step (`--spec-draft-n-max`; llama.cpp's
    default 16)."""
    draft_min_tokens: int | None = Field(default=None, ge=0, le=128)
    """With `draft_model`: fewest drafted tokens worth verifying (`--spec-draft-n-min`)."""
    draft_p_min: float | None = Field(default=None, ge=0, le=1)
    """With `draft_model`: the draft stops at a token it is less sure of than this
    (`--spec-draft-p-min`; default 0.75)."""
    draft_gpu_layers: int | None = Field(default=None, ge=-1, le=1024)
    """With `draft_model`: the draft's layers on the GPU; -1: all (`-ngld`)."""
    prompt_lookup_tokens: int | None = Field(default=None, ge=1, le=64)
    """Speculative decoding without a draft model: up to this many tokens proposed from an
    earlier occurrence of the last tokens in the context (`--draft_model
    prompt-lookup-decoding --draft_model_num_pred_tokens`; llama-server: `--spec-type
    ngram-simple --spec-ngram-simple-size-m`). Pays off when the answer repeats the prompt."""
    image_min_tokens: int | None = Field(default=None, ge=1, le=16384)
    """llama-server only, with `mmproj`: fewest tokens one image becomes, for projectors of
    dynamic resolution (`--image-min-tokens`; default: the projector's)."""
    image_max_tokens: int | None = Field(default=None, ge=1, le=16384)
    """llama-server only, with `mmproj`: most tokens one image becomes (`--image-max-tokens`):
    the budget that bounds an image's context and encode time."""
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    """llama-server only: where the thinking goes (`--reasoning-format`): `none` leaves it
    in the text, `deepseek` in `reasoning_content`, `deepseek-legacy` both. Default: auto."""
    reasoning_budget: int | None = Field(default=None, ge=-1, le=1_000_000)
    """llama-server only: thinking tokens allowed (`--reasoning-budget`); -1 unlimited, 0 none."""
    threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation (default: the engine's choice)."""
    embedding: bool = False
    """Serve embeddings instead of generation (`--embeddings` / `--embedding true`)."""
    jinja: bool = True
    """llama-server: render chats with the GGUF's Jinja template (`--jinja`), which tool
    calls need."""
    chat_format: str | None = None
    """llama_cpp.server only: a named chat format instead of the GGUF's template."""
    extra_args: list[str] = Field(default_factory=list)
    """Appended to the command line as they are. An admin's load-time override keeps these
    in front and may add only performance flags (`-b`, `-ub`, `--mlock`, `-ctk`, ...; see
    `backends/managed/engine_flags.py`): never one that changes the model, the address,
    files, keys or templates (400 naming the flag)."""

    @field_validator("flash_attention", mode="before")
    @classmethod
    def _flash_attention_bool(cls, value: Any) -> Any:
        return flash_attention_value(value)  # the former boolean: true is on, false off

    @model_validator(mode="after")
    def _knobs_fit_the_runner(self) -> LlamaServerOptions:
        native = self.binary is not None
        values = {name: getattr(self, name) for name in KNOBS}
        flash = self.flash_attention or ("auto" if native else "off")  # each runner's default
        problem = (runner_problem(values, native=native) or pairing_problem(values, has_mmproj=bool(self.mmproj))
                   or quantized_v_problem(self.type_v, flash)
                   or duplicate_problem(values, self.extra_args, native=native))  # fmt: skip
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _override_keeps_config(self, info: ValidationInfo) -> LlamaServerOptions:
        configured = configured_options(info)
        if isinstance(configured, LlamaServerOptions):
            policy = LLAMA_SERVER if self.binary else LLAMA_CPP_PYTHON
            problem = policy.problem(configured.extra_args, self.extra_args)
            if problem is not None:
                raise ValueError(f"extra_args: {problem}")
        return self


class LlamaServerBackend(LlamaServerTokenizer, ManagedServerBackend):
    Options = LlamaServerOptions
    capabilities = MANAGED_CAPABILITIES
    overridable = frozenset({
        "context_length", "gpu_layers", "parallel", "threads", "flash_attention", "extra_args", "type_k", "type_v",
        "draft_max_tokens", "draft_min_tokens", "draft_p_min", "draft_gpu_layers", "prompt_lookup_tokens",
        "image_min_tokens", "image_max_tokens", "reasoning_format", "reasoning_budget",
    })  # fmt: skip
    """Not `draft_model`, `mmproj` or `binary`: files and programs are the config's word."""
    options: LlamaServerOptions

    @classmethod
    def capabilities_for(cls, options: LlamaServerOptions) -> Capabilities:
        """Started for embeddings it does not chat; llama_cpp.server (no `binary`) runs one
        request at a time, llama-server `parallel` of them. Only llama-server has tokenizer
        routes that keep modelpool's contract (llama_cpp.server's always add BOS and abort
        on an id outside the vocabulary). Thinking goes through the template only on llama-server
        with Jinja on: it renders `chat_template_kwargs` and splits the reasoning apart;
        llama_cpp.server ignores those kwargs and returns the reasoning inside the text."""
        modalities = {Modality.TEXT, Modality.IMAGE} if options.mmproj else {Modality.TEXT}
        return replace(
            cls.capabilities,
            default_tasks=frozenset({Task.EMBEDDING} if options.embedding else {Task.CHAT, Task.COMPLETION}),
            engine_concurrency=options.parallel if options.binary else 1,
            context_length=options.context_length,
            modalities=frozenset(modalities),  # with its projector, the engine reads images
            max_images=options.max_images if options.mmproj else None,
            tokenizer=options.binary is not None,
            thinking_in_template=options.binary is not None and options.jinja,
        )

    def __init__(self, model: ModelConfig, options: LlamaServerOptions, context: BackendContext) -> None:
        super().__init__(model, options, context)
        self.context_length = options.context_length
        self.health_path = "/health" if options.binary else "/v1/models"  # llama_cpp.server has no /health
        # Both read their key from the environment, off the command line `ps` shows: llama.cpp's
        # `--api-key` is LLAMA_API_KEY; llama_cpp.server's settings are pydantic-settings (API_KEY).
        self.api_key_env = "LLAMA_API_KEY" if options.binary else "API_KEY"
        self.draft_weights: Path | None = None
        """The draft model's resolved file (resolved with the weights, before a start)."""

    def files(self, weights: Path) -> list[Path]:
        draft = [self.draft_weights or self._resolve_draft()] if self.options.draft_model else []
        return [weights, *([Path(self.options.mmproj)] if self.options.mmproj else []), *draft]

    async def estimate_memory(self) -> MemoryEstimate:
        """The engine process (~256 MiB), and from the GGUF its weights and KV cache for every
        slot, the offloaded layers' share on the GPU (`gpu_estimates.llama_split`)."""
        weights, o = await self.weights(), self.options
        tokens = o.context_length * (o.parallel if o.binary else 1)
        kv_types = (o.type_k, o.type_v)  # None: f16, llama.cpp's default
        layers = o.gpu_layers if self.gpus() else 0  # no NVIDIA GPU seen: the engine runs on the CPU
        split = await asyncio.to_thread(llama_split, weights, layers, tokens, *kv_types)
        ram, gpu = split.ram_bytes + 256 * 1024 * 1024, split.gpu_bytes
        if self.draft_weights is not None:  # the draft's weights, where its layers go (its cache is small)
            draft = files_size(self.draft_weights)
            offloads = o.draft_gpu_layers != 0 and (o.draft_gpu_layers is not None or o.gpu_layers != 0)
            on_gpu = offloads and bool(self.gpus())
            ram, gpu = (ram, gpu + draft) if on_gpu else (ram + draft, gpu)
        return MemoryEstimate(ram_bytes=ram, gpu_bytes=gpu)

    def command(self, weights: Path) -> list[str]:
        return self._native(weights) if self.options.binary else self._python(weights)

    def _native(self, weights: Path) -> list[str]:
        o = self.options
        assert o.binary is not None
        argv = [o.binary, "-m", str(weights), "--host", self.bind_host, "--port", "{port}", "--alias", self.model.id]
        # llama-server divides -c among its slots: each request must still get context_length.
        argv += ["-c", str(o.context_length * o.parallel), "-ngl", str(o.gpu_layers), "-np", str(o.parallel)]
        argv += ["--mmproj", o.mmproj] if o.mmproj else []
        argv += ["-t", str(o.threads)] if o.threads else []
        argv += ["--embeddings"] if o.embedding else []
        argv += ["--jinja"] if o.jinja else []
        return argv + knob_argv(self._knob_values(), native=True) + o.extra_args

    def _python(self, weights: Path) -> list[str]:
        o = self.options
        argv = [o.python or self.default_python, "-m", "llama_cpp.server", "--model", str(weights)]
        argv += ["--host", self.bind_host, "--port", "{port}", "--model_alias", self.model.id]
        # Its default lets a new request cut off the running one (even one that just finished,
        # racing its cleanup); modelpool's own queue already keeps to one request at a time.
        argv += ["--interrupt_requests", "false"]
        argv += ["--n_ctx", str(o.context_length), "--n_gpu_layers", str(o.gpu_layers)]
        argv += ["--clip_model_path", o.mmproj] if o.mmproj else []
        argv += ["--n_threads", str(o.threads)] if o.threads else []
        argv += ["--embedding", "true"] if o.embedding else []
        # With a projector, only the mtmd chat format reads images (others drop them silently).
        chat_format = o.chat_format or ("mtmd" if o.mmproj else None)
        argv += ["--chat_format", chat_format] if chat_format else []
        return argv + knob_argv(self._knob_values(), native=False) + o.extra_args

    def _knob_values(self) -> dict[str, Any]:
        values = {name: getattr(self.options, name) for name in KNOBS}
        if self.options.draft_model is not None:
            values["draft_model"] = str(self.draft_weights or self._resolve_draft())
        return values

    async def weights(self) -> Path:
        weights = await super().weights()
        if self.options.draft_model is not None:
            self.draft_weights = await asyncio.to_thread(self._resolve_draft)
        return weights

    def _resolve_draft(self) -> Path:
        """The draft model's file, its source resolved as a model's `source` is."""
        assert self.options.draft_model is not None
        return resolve_source(self.options.draft_model, model_id=self.model.id, hub=self.hub, backend="llama_server")
