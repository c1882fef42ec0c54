"""LlamaCppBackend: GGUF models for chat and completions, many requests at once in one
llama.cpp context (continuous batching: see engine.py)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncGenerator
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.constraint import GrammarCompiler, TokenConstraint
from modelpool.backends.context import BackendContext
from modelpool.backends.gpu_estimates import llama_split
from modelpool.backends.llama_cpp.adapters import AdapterSources, AdapterSpec
from modelpool.backends.llama_cpp.chat_template import ChatTemplate
from modelpool.backends.llama_cpp.engine import LlamaEngine
from modelpool.backends.llama_cpp.model import GgufModel, grammar_tokenizer
from modelpool.backends.llama_cpp.sequence import Job, ScoringJob
from modelpool.backends.llama_cpp.speculative import Drafter, SpeculativeOptions, check_vocabulary
from modelpool.backends.llama_cpp.vision import ImageProjector, ImagePrompt, with_markers
from modelpool.backends.llama_knobs import (
    AttentionSettings,
    FlashAttention,
    KvCacheType,
    flash_attention_value,
    quantized_v_problem,
)
from modelpool.backends.managed.engine_flags import configured_options
from modelpool.backends.requirements import require_engine
from modelpool.backends.textgen.channel import Channel, chunk_stream
from modelpool.backends.textgen.decoding import check_token_ids, start_of_text, tokens_to_generate, with_echo
from modelpool.backends.textgen.pipeline import chat_output, prompt_clock
from modelpool.backends.threads import in_passing_thread
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import locate, resolve_source
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import (
    ChatRequest,
    CompletionRequest,
    GenerationChunk,
    SamplingParams,
    TokenLogprob,
    TokenPiece,
    Usage,
)
from modelpool.offload import GRAMMAR_COMPILES, TEMPLATE_RENDERS
from modelpool.tasks import Task
from modelpool.tools.grammar import grammar_param, output_grammar
from modelpool.tools.parsers import make_parser
from modelpool.tools.prompt import ChatPlan, plan_chat

# Rough: small models need ~25 KiB of f16 KV cache per token, 7B ones ~500 KiB. A
# measurement after loading replaces the estimate; set `memory_bytes` to be exact.
PARALLEL_CPU, PARALLEL_GPU = 8, 32
# On a CPU, a shorter context buys more sequences in the KV cells 8 × 4096 always had: up to
# 16, so a burst of 16 clients decodes together instead of the 9th waiting a whole reply
# (the starter, n_ctx 2048: 16 sequences, the same 32768 cells and idle memory as before).
CPU_DEFAULT_CELLS, PARALLEL_CPU_MOST = PARALLEL_CPU * 4096, 16
BATCH_INVARIANT_UBATCH = 63  # ggml-cpu's flash attention tiles queries from GGML_FA_TILE_Q = 64 rows


class LlamaCppOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n_ctx: int = Field(default=4096, ge=16, le=1 << 20)  # × parallel (≤ 256) stays under 2**31 (uint32 n_ctx)
    """Context length of one request in tokens (prompt + completion)."""
    parallel: int | None = Field(default=None, ge=1, le=256)
    """Requests decoded together in one context (continuous batching); the KV cache holds
    `n_ctx × parallel` tokens, so each of them may fill its whole context. Default on CPU:
    as many as fit 32768 KV cells (8 × 4096), at least 8 and at most 16 (n_ctx 2048 or
    less: 16); 32 with layers on a GPU. It is also the model's default `max_concurrency`."""
    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation (default: all cores)."""
    n_batch: int = Field(default=512, ge=1)
    """Tokens evaluated per step: every decoding request's next token, then as many prompt
    tokens of newcomers as fit. Smaller keeps running streams smoother while long prompts
    arrive; larger fills a burst's prompts sooner."""
    batch_invariant: bool | None = None
    """Keep a request's output independent of what else is in the batch: greedy and seeded
    requests give the same tokens alone or in a busy batch (measured bit-exact on CPU).
    llama.cpp's CPU attention rounds differently with 64 or more query rows (a tiled
    kernel) and with a single row once 512 KV cells are in use (a split-KV kernel), so
    micro-batches stay under 64 rows (`n_ubatch` 63) and never hold a lone row (a spare row
    is added). Costs a little prefill speed (docs/engines.md). Default: on for CPU, off with a GPU,
    whose kernels give no such guarantee."""
    n_ubatch: int | None = Field(default=None, ge=1)
    """Tokens llama.cpp computes at once inside a step (default: 63 when batch-invariant,
    otherwise 512)."""
    n_gpu_layers: int = 0
    """Layers offloaded to the GPU (-1: all); needs a GPU build of llama-cpp-python."""
    use_mmap: bool = True
    """Map the GGUF file instead of reading it into memory."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the one inside the GGUF."""
    mmproj: str | None = None
    """A GGUF vision projector (`mmproj-*.gguf`) for the model: it then reads images."""
    max_images: int = Field(default=4, ge=1)
    """Most images one request may carry (with `mmproj`)."""
    image_min_tokens: int | None = Field(default=None, ge=1, le=16384)
    """With `mmproj`: fewest tokens one image becomes, for projectors of dynamic resolution
    (Qwen2-VL and later); default: the projector's own."""
    image_max_tokens: int | None = Field(default=None, ge=1, le=16384)
    """With `mmproj`: most tokens one image becomes, the budget that bounds an image's
    share of the context and its encode time; default: the projector's own."""
    type_k: KvCacheType | None = None
    """KV-cache type of K: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 (default f16).
    q8_0 halves the cache; its output differs slightly from f16's."""
    type_v: KvCacheType | None = None
    """KV-cache type of V (default f16); a quantized one needs flash attention on or auto."""
    flash_attention: FlashAttention = "auto"
    """Flash attention: `on`, `off` or `auto` (llama.cpp decides per device; on for CPU).
    Batch invariance needs it: `off` only with `batch_invariant: false`."""
    reuse_prompt_cache: bool = False
    """Keep a finished request's KV cells and start a later request that shares its prefix
    (a system prompt, a multi-turn history) from there. Faster for long shared prompts, but
    greedy or seeded output may then differ slightly from a fresh evaluation (see docs/engines.md)."""
    speculative: SpeculativeOptions | None = None
    """Speculative decoding with a draft model (`draft`, `n_max`, `n_min`, `p_min`,
    `n_gpu_layers`, `n_ctx`): the same output, sooner when the draft guesses well."""

    @field_validator("flash_attention", mode="before")
    @classmethod
    def _flash_attention_bool(cls, value: Any) -> Any:
        return flash_attention_value(value)

    @model_validator(mode="after")
    def _knobs_fit(self) -> LlamaCppOptions:
        budget = {"image_min_tokens": self.image_min_tokens, "image_max_tokens": self.image_max_tokens}
        if self.mmproj is None and (set_ := [name for name, value in budget.items() if value is not None]):
            raise ValueError(f"{', '.join(set_)}: an image-token budget needs a vision projector (`mmproj`)")
        low, high = self.image_min_tokens, self.image_max_tokens
        if low is not None and high is not None and low > high:
            raise ValueError(f"image_min_tokens ({low}) is above image_max_tokens ({high})")
        problem = quantized_v_problem(self.type_v, self.flash_attention)
        if problem is not None:
            raise ValueError(problem)
        if self.invariant and self.flash_attention == "off":
            # Measured on SmolLM2: 1 of 16 greedy replies changed in a batch of 16 with it off, 0 with it on.
            raise ValueError("flash_attention 'off' breaks batch invariance (llama.cpp's other CPU attention "
                             "kernel sums in another order in a batch); set batch_invariant: false for it")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _override_keeps_draft(self, info: ValidationInfo) -> LlamaCppOptions:
        # An admin's override names no file the config did not: the draft is the config's word.
        configured = configured_options(info)
        if isinstance(configured, LlamaCppOptions):
            draft, allowed = (None if o.speculative is None else o.speculative.draft for o in (self, configured))
            if draft is not None and draft != allowed:
                raise ValueError("speculative: an override may change the numbers or turn drafting off, "
                                 "not name the draft (the config's word)")  # fmt: skip
        return self

    @property
    def attention(self) -> AttentionSettings:
        return AttentionSettings(self.type_k, self.type_v, self.flash_attention)

    @property
    def sequences(self) -> int:
        if self.parallel is not None:
            return self.parallel
        if self.n_gpu_layers != 0:
            return PARALLEL_GPU
        return min(PARALLEL_CPU_MOST, max(PARALLEL_CPU, CPU_DEFAULT_CELLS // self.n_ctx))

    @property
    def invariant(self) -> bool:
        return self.batch_invariant if self.batch_invariant is not None else self.n_gpu_layers == 0

    @property
    def micro_batch(self) -> int:
        if self.n_ubatch is not None:
            return min(self.n_ubatch, BATCH_INVARIANT_UBATCH) if self.invariant else self.n_ubatch
        return BATCH_INVARIANT_UBATCH if self.invariant else 512


class LlamaCppBackend(DeclaredBackend):
    Options = LlamaCppOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        prompt_scoring=True,
        tools=True,
        structured_output=True,
        tokenizer=True,
        adapters=True,
    )
    overridable = frozenset({
        "n_ctx", "parallel", "n_threads", "n_batch", "n_ubatch", "batch_invariant", "n_gpu_layers",
        "chat_template", "reuse_prompt_cache", "max_images", "image_min_tokens", "image_max_tokens", "type_k", "type_v",
        "flash_attention", "speculative",
    })  # fmt: skip

    @classmethod
    def capabilities_for(cls, options: LlamaCppOptions) -> Capabilities:
        declared = replace(cls.capabilities, context_length=options.n_ctx, engine_concurrency=options.sequences)
        if options.mmproj is None:
            return declared
        return replace(declared, modalities=frozenset({Modality.TEXT, Modality.IMAGE}), max_images=options.max_images)

    def __init__(self, model: ModelConfig, options: LlamaCppOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self.tasks = context.tasks
        self.gpus = context.gpus
        self._engine: LlamaEngine | None = None
        self._template: ChatTemplate | None = None
        self.adapter_sources = AdapterSources(model, context.hub)

    async def estimate_memory(self) -> MemoryEstimate:
        """The GGUF plus its KV cache for every parallel context (from the file's layers and
        KV heads, at the cache's type), before loading: with layers offloaded, the GPU holds
        their share (`gpu_estimates.llama_split`); no NVIDIA GPU seen, all of it is RAM (a
        CPU build ignores the setting; Apple's unified memory is RAM). A measurement replaces
        the RAM part."""
        path = await locate(self.model, self.hub)
        o = self.options
        kv_types = (o.type_k, o.type_v)  # None: f16, llama.cpp's default
        layers = o.n_gpu_layers if self.gpus() else 0
        split = await asyncio.to_thread(llama_split, path, layers, o.n_ctx * o.sequences, *kv_types)
        adapters = await asyncio.to_thread(self.adapter_sources.largest_bytes)  # on the device the layers are on
        on_gpu = layers != 0 and split.gpu_bytes > 0
        estimate = MemoryEstimate(ram_bytes=split.ram_bytes + 32 * 1024 * 1024 + (0 if on_gpu else adapters),
                                  gpu_bytes=split.gpu_bytes + (adapters if on_gpu else 0))  # fmt: skip
        return await self._with_draft(estimate)

    async def _with_draft(self, estimate: MemoryEstimate) -> MemoryEstimate:
        """The draft's GGUF and KV cache on top (f16 cells), split as its `n_gpu_layers` says."""
        draft = self.options.speculative
        if draft is None:
            return estimate
        path = await asyncio.to_thread(self._draft_path)
        tokens = (draft.n_ctx or self.options.n_ctx) * self.options.sequences
        layers = draft.n_gpu_layers if self.gpus() else 0  # as the model's: no GPU, nothing offloaded
        split = await asyncio.to_thread(llama_split, path, layers, tokens)
        return replace(estimate, ram_bytes=estimate.ram_bytes + split.ram_bytes,
                       gpu_bytes=estimate.gpu_bytes + split.gpu_bytes)  # fmt: skip

    def _draft_path(self) -> Path:
        assert self.options.speculative is not None
        return resolve_source(self.options.speculative.draft, model_id=self.model.id, hub=self.hub, backend="llama_cpp")

    async def warmup(self) -> None:
        prompt = await self._tokenize("Hello", add_bos=True)
        async for _ in self._generate(prompt, SamplingParams(max_tokens=1, temperature=0.0), "prompt"):
            continue

    async def start(self) -> None:
        require_engine(self.model.id, ("llama_cpp",), "llama")
        path = await locate(self.model, self.hub)
        self._engine = await in_passing_thread(self._load, str(path))
        for spec in await asyncio.to_thread(self.adapter_sources.preloaded):
            await asyncio.wrap_future(self._engine.load_adapter(spec))
        if Task.CHAT in self.tasks:
            self._template = self._chat_template()

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)

    async def check_health(self) -> None:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        started = prompt_clock()
        engine = self._require_engine()
        images = [image.image for message in request.messages for image in message.images]
        plan, prompt_text = await TEMPLATE_RENDERS.run(lambda: self._render_chat(request, "model", marker=True))
        projector = engine.projector
        constraint = await self._constraint(plan.grammar, grammar_param(request))
        adapter = await self._adapter(request.adapter)
        add_bos = self._add_bos(prompt_text)
        prompt_seconds = None  # an image prompt is tokenized by the engine, with its images: not timed here
        if images and projector is not None:
            chunks = self._generate([], request.sampling, "messages", constraint,
                                    images=ImagePrompt(prompt_text, images, add_bos), adapter=adapter)  # fmt: skip
        else:
            prompt = await self._tokenize(prompt_text, add_bos=add_bos)
            prompt_seconds = prompt_clock() - started
            chunks = self._generate(prompt, request.sampling, "messages", constraint, adapter=adapter)
        tools = make_parser(plan.parser, live=plan.live) if plan.parser else None
        reasoning = self.model.reasoning_parser
        async for chunk in chat_output(chunks, reasoning=reasoning, tools=tools, prompt_seconds=prompt_seconds):
            yield chunk

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        engine = self._require_engine()
        if isinstance(request.prompt, str):
            prompt = await self._tokenize(request.prompt, add_bos=self._add_bos(request.prompt))
            echo_text = request.prompt
        else:
            prompt = self._check_token_ids(request.prompt)
            echo_text = engine.model.detokenize(prompt).decode("utf-8", errors="replace")
        prompt = self._start_of(prompt)
        adapter = await self._adapter(request.adapter)
        echoed: tuple[TokenLogprob, ...] = ()
        if request.echo and request.sampling.logprobs is not None:
            echoed = tuple(await self._score(prompt, request.sampling.logprobs, adapter))
        grammar = output_grammar(request.output) if request.output is not None else None
        constraint = await self._constraint(grammar, "response_format")
        chunks = self._generate(prompt, request.sampling, "prompt", constraint, adapter=adapter)
        async for chunk in with_echo(chunks, echo_text, echoed) if request.echo else chunks:
            yield chunk

    async def tokenize(self, text: str) -> list[int]:
        return await self._tokenize(text, add_bos=False)

    # ----- tokenizer (POST /tokenize, /detokenize) -------------------------------------

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return await self._tokenize(text, add_bos=add_special_tokens)  # llama.cpp adds BOS only if the model does

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        _, text = await TEMPLATE_RENDERS.run(
            lambda: self._render_chat(request, "messages", add_generation_prompt=add_generation_prompt)
        )
        return await self._tokenize(text, add_bos=self._add_bos(text))

    async def decode_tokens(self, ids: list[int]) -> str:
        model = self._require_engine().model
        check_token_ids(ids, model.n_vocab, "tokens")
        return await asyncio.to_thread(lambda: model.detokenize(ids, special=True).decode("utf-8", errors="replace"))

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        model = self._require_engine().model  # a ctypes call per id: off the event loop
        return await asyncio.to_thread(lambda: [TokenPiece(t, model.piece(t, special=True), model.spelling(t))
                                                for t in ids])  # fmt: skip

    async def max_model_len(self) -> int | None:
        return self.options.n_ctx

    async def start_token(self) -> int | None:
        bos = self._require_engine().model.bos
        return bos if bos >= 0 else None

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        return await self._score(self._check_token_ids(tuple(tokens)), top_n)

    # ----- internals -----------------------------------------------------------------

    async def _generate(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        param: str,
        constraint: TokenConstraint | None = None,
        *,
        images: ImagePrompt | None = None,
        adapter: AdapterSpec | None = None,
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Stream a generation from the batch engine. The first chunk is empty and comes once
        the request is known to fit, so request errors are raised before anything streams."""
        engine = self._require_engine()
        max_new = 0
        if images is None:
            prompt = self._start_of(prompt, param)
            max_new = tokens_to_generate(len(prompt), sampling.max_tokens, engine.n_ctx, param)
            if max_new == 0:
                yield GenerationChunk()
                yield GenerationChunk(finish_reason="length", usage=Usage(len(prompt), 0))
                return
        channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        job = Job(prompt, model=engine.model, sampling=sampling, max_new=max_new, channel=channel,
                  constraint=constraint, images=images, seed=seed, adapter=adapter)  # fmt: skip
        engine.submit(job)
        async for chunk in chunk_stream(channel):
            yield chunk

    async def load_adapter(self, name: str) -> None:
        spec = await asyncio.to_thread(self.adapter_sources.spec, name)
        await asyncio.wrap_future(self._require_engine().load_adapter(spec))

    async def unload_adapter(self, name: str) -> bool:
        unloaded: bool = await asyncio.wrap_future(self._require_engine().unload_adapter(name))
        return unloaded

    def loaded_adapters(self) -> list[str]:
        engine = self._engine
        return [adapter.spec.name for adapter in engine.adapters.loaded] if engine is not None else []

    def adapter_bytes(self) -> int:
        engine = self._engine
        return engine.adapters.total_bytes() if engine is not None else 0

    async def _adapter(self, name: str | None) -> AdapterSpec | None:
        """The adapter a request names, its file resolved (off the loop: `hf:` may download)."""
        return None if name is None else await asyncio.to_thread(self.adapter_sources.spec, name)

    async def _score(self, prompt: list[int], top_n: int, adapter: AdapterSpec | None = None) -> list[TokenLogprob]:
        """Log-probabilities of every token given the ones before it, from one evaluation of
        the prompt (a sequence of its own in the batch, every position's logits kept)."""
        engine = self._require_engine()
        tokens_to_generate(len(prompt), 0, engine.n_ctx, "prompt")
        job = ScoringJob(prompt, top_n=top_n, adapter=adapter)
        engine.submit(job)
        return await asyncio.wrap_future(job.future)

    async def _tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        model = self._require_engine().model
        if len(text) < 2048:  # microseconds: not worth a thread hop
            return model.tokenize(text, add_bos=add_bos)
        return await asyncio.to_thread(model.tokenize, text, add_bos=add_bos)

    def _start_of(self, prompt: list[int], param: str = "prompt") -> list[int]:
        """An empty prompt means "from the start": the BOS token, as OpenAI's API treats it."""
        return prompt or start_of_text(self._require_engine().model.bos, param)

    def _check_token_ids(self, tokens: tuple[int, ...]) -> list[int]:
        return check_token_ids(tokens, self._require_engine().model.n_vocab, "prompt")

    async def _constraint(self, grammar: str | None, param: str) -> TokenConstraint | None:
        if grammar is None:
            return None
        return await GRAMMAR_COMPILES.run(lambda: self._grammars.start(grammar, param))

    @cached_property
    def _grammars(self) -> GrammarCompiler:
        """Built on the first constrained request (~0.2 s for a 49k vocabulary), then kept."""
        model = self._require_engine().model
        eog = [int(t) for t in model.eog_ids]
        return GrammarCompiler(grammar_tokenizer(model), model.n_vocab, eog, model.eos)

    def _load(self, path: str) -> LlamaEngine:
        opts = self.options
        threads = opts.n_threads or os.cpu_count() or 1
        model = GgufModel(path, n_gpu_layers=opts.n_gpu_layers, use_mmap=opts.use_mmap, model_id=self.model.id)
        drafter = None
        try:
            drafter = self._drafter(model, threads)
            engine = LlamaEngine(model, n_ctx=opts.n_ctx, parallel=opts.sequences, n_batch=opts.n_batch,
                                 n_ubatch=opts.micro_batch, n_threads=threads, batch_invariant=opts.invariant,
                                 reuse_prompt_cache=opts.reuse_prompt_cache, model_id=self.model.id,
                                 attention=opts.attention, drafter=drafter,
                                 max_adapters=self.model.max_adapters)  # fmt: skip
        except BaseException:
            if drafter is not None:
                drafter.close()
            model.close()
            raise
        if opts.mmproj is not None:
            try:
                engine.projector = ImageProjector(model, _beside(path, opts.mmproj), n_threads=threads,
                                                  use_gpu=opts.n_gpu_layers != 0, model_id=self.model.id,
                                                  image_tokens=(opts.image_min_tokens, opts.image_max_tokens),
                                                  flash_attention=opts.flash_attention)  # fmt: skip
            except BaseException:
                engine.close()
                raise
        return engine

    def _drafter(self, target: GgufModel, threads: int) -> Drafter | None:
        """The draft model and its context (`speculative`), its vocabulary checked against the model's."""
        options = self.options.speculative
        if options is None:
            return None
        path = str(self._draft_path())
        draft = GgufModel(path, n_gpu_layers=options.n_gpu_layers, use_mmap=self.options.use_mmap,
                          model_id=self.model.id)  # fmt: skip
        try:
            check_vocabulary(target, draft, model_id=self.model.id, draft_path=path)
            return Drafter(draft, n_ctx=options.n_ctx or self.options.n_ctx, parallel=self.options.sequences,
                           n_threads=threads, options=options, model_id=self.model.id)  # fmt: skip
        except BaseException:
            draft.close()
            raise

    def _render_chat(
        self, request: ChatRequest, param: str, *, marker: bool = False, add_generation_prompt: bool = True
    ) -> tuple[ChatPlan, str]:
        """The chat's tool plan and its prompt text by the model's template (image markers
        where the images go, with `marker` and a projector)."""
        template, projector = self._template, self._require_engine().projector
        if template is None:
            raise InvalidRequest(f"model '{self.model.id}' has no chat template; use /v1/completions", param=param)
        plan = plan_chat(
            request,
            template_source=template.source,
            configured_parser=self.model.tool_parser,
            constrain_auto=self.model.constrained_auto_tools,
        )
        messages = with_markers(plan.messages, projector.marker) if marker and projector else plan.messages
        variables = request.template_kwargs
        return plan, template.render(messages, plan.tools, add_generation_prompt=add_generation_prompt, **variables)

    def _chat_template(self) -> ChatTemplate | None:
        model = self._require_engine().model
        source = self.options.chat_template or model.metadata("tokenizer.chat_template")
        if not source:
            return None
        return ChatTemplate(source, bos_token=self._token_text(model.bos), eos_token=self._token_text(model.eos))

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._require_engine().model.piece(token, special=True).decode("utf-8", errors="replace")

    def _add_bos(self, text: str) -> bool:
        """Add BOS when the model asks for it, unless the text (a rendered template) has it."""
        model = self._require_engine().model
        if not model.adds_bos:
            return False
        bos = self._token_text(model.bos)
        return not (bos and text.startswith(bos))

    def _require_engine(self) -> LlamaEngine:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._engine


def _beside(model_path: str, mmproj: str) -> str:
    """A relative projector path is looked up beside the model file first (detection names a
    hub repo's projector so, wherever the hub cache put the files), else taken as given."""
    candidate = Path(model_path).parent / mmproj
    return str(candidate) if not Path(mmproj).is_absolute() and candidate.is_file() else mmproj
