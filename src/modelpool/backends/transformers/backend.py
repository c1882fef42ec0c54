"""TransformersBackend: any Hugging Face causal LM, on PyTorch, with continuous batching."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from concurrent.futures import Future
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from modelpool.backends import hf_tokens
from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.constraint import GrammarCompiler, TokenConstraint
from modelpool.backends.context import BackendContext
from modelpool.backends.gpu_estimates import parameters_at, safetensors_parameters
from modelpool.backends.requirements import require_engine
from modelpool.backends.textgen.channel import Channel, chunk_stream
from modelpool.backends.textgen.decoding import check_token_ids, start_of_text, tokens_to_generate, with_echo
from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
from modelpool.backends.textgen.hf_convert import hf_folder_for
from modelpool.backends.textgen.hf_text import chat_prompt_ids, encode_text
from modelpool.backends.textgen.pipeline import chat_output, prompt_clock
from modelpool.backends.threads import EngineThread, drain, in_passing_thread
from modelpool.backends.torch_device import estimate_on, pick_device, weights_placement
from modelpool.backends.torch_loading import MODEL_CONSTRUCTION
from modelpool.backends.transformers.adapters import AdapterFolders, AdapterSpec, PeftAdapters
from modelpool.backends.transformers.beam import check_beam_sampling, run_beam_search
from modelpool.backends.transformers.engine import BatchLimits, ContinuousBatcher
from modelpool.backends.transformers.kv_budget import batch_kv_bytes, kv_shape
from modelpool.backends.transformers.packed_linear import can_pack, pack_linears
from modelpool.backends.transformers.sampling import make_generator
from modelpool.backends.transformers.scoring import score_tokens
from modelpool.backends.transformers.sequence import Sequence
from modelpool.backends.transformers.video import VideoSettings, video_settings
from modelpool.backends.transformers.vision import Media, check_video_model, load_vision_model, render_with_media
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import (
    DEFAULT_MAX_BEAM_SIZE,
    DEFAULT_MAX_BEAM_TOKENS,
    MAX_BEAM_SIZE,
    MAX_BEAM_TOKENS,
    BeamSearch,
    ChatRequest,
    CompletionRequest,
    GenerationChunk,
    SamplingParams,
    TokenLogprob,
    TokenPiece,
    Usage,
)
from modelpool.offload import TEMPLATE_RENDERS
from modelpool.tasks import Task
from modelpool.tools.grammar import grammar_param, output_grammar
from modelpool.tools.parsers import make_parser
from modelpool.tools.prompt import ChatPlan, plan_chat

log = logging.getLogger("modelpool.backends")


class TransformersOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    device: str = "auto"
    """cpu, cuda, cuda:N, mps, or auto (CUDA, then MPS, then CPU)."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weights' dtype; auto: float32 on CPU, bfloat16 on a GPU."""
    max_batch_size: int = Field(default=32, ge=1)
    """Most sequences decoded together."""
    max_batch_tokens: int = Field(default=32768, ge=1)
    """Most token places the running batch's KV cache holds: rows × the longest row (the
    cache is left-padded). A prompt joins while the batch stays within it; as rows grow, the
    latest joined step out before a step would pass it and resume later (their KV
    recomputed). The model's memory counts the cache at this size from the load on."""
    prefill_chunk: int = Field(default=256, ge=1)
    """Prompt tokens evaluated between two decode steps (padding included), so running
    streams never stall long; a longer prompt is prefilled in pieces of this size."""
    prefill_rows: int = Field(default=32, ge=1)
    """Most waiting prompts prefilled together in one padded forward (1: one at a time)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + completion (default: the model's own limit, capped at 8192)."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's."""
    trust_remote_code: bool = False
    """Allow custom model code shipped with the weights."""
    vision: bool = False
    """An image-text-to-text model (LLaVA, Idefics3/SmolVLM, ...): loaded with its processor,
    it reads images in chat messages."""
    max_images: int = Field(default=8, ge=1)
    """Most images one request may carry (vision models)."""
    video: bool = False
    """With `vision`: the model reads `video_url` parts (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; a
    model of another family is refused at load), sampled into frames by `video_fps` and
    `video_max_frames`."""
    video_fps: float = Field(default=2.0, gt=0, le=30)
    """Frames a second a video is sampled into (Qwen's own default: 2)."""
    video_max_frames: int = Field(default=32, ge=1, le=768)
    """Most frames one video is sampled into: a longer video gets them spread over its length."""
    device_map: Literal["auto"] | None = None
    """`auto`: accelerate places the weights over the GPUs there are (then the CPU), for a
    model larger than one GPU; `device` is then not used. Where it put them shows in the
    model's status (`placement`)."""
    max_beam_size: int = Field(default=DEFAULT_MAX_BEAM_SIZE, ge=1, le=MAX_BEAM_SIZE)
    """Widest beam search a request may ask (`beam_size`; 1: none). It runs on the engine
    thread with this many sequences, the batch's streams waiting meanwhile."""
    max_beam_tokens: int = Field(default=DEFAULT_MAX_BEAM_TOKENS, ge=1, le=MAX_BEAM_TOKENS)
    """Longest answer a beam search request may ask (`max_tokens`; more: a 400 naming it;
    none set: cut here). It cannot be stopped midway, and
    every other stream of the engine waits for it."""
    onednn_linear: bool = True
    """On the CPU at float32 (text models): the linear layers run on oneDNN with their
    weights packed once at load, 2–3× faster than PyTorch's default at 16–32 streams, the
    same greedy tokens (see docs/engines.md). A tied LM head (SmolLM2, Llama 3.2) gets a
    packed copy: its vocabulary × hidden size more memory. false: PyTorch's own `F.linear`."""

    @model_validator(mode="after")
    def _video_needs_vision(self) -> TransformersOptions:
        if self.video and not self.vision:
            raise ValueError("video: true needs vision: true (a video model is a vision model)")
        return self


class TransformersBackend(DeclaredBackend):
    """Continuous batching: up to `max_batch_size` sequences decode together."""

    Options = TransformersOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        prompt_scoring=True,
        tools=True,
        structured_output=True,
        tokenizer=True,
        adapters=True,
        max_beam_size=DEFAULT_MAX_BEAM_SIZE,
        max_beam_tokens=DEFAULT_MAX_BEAM_TOKENS,
    )
    overridable = frozenset(
        {
            "max_batch_size",
            "max_batch_tokens",
            "prefill_chunk",
            "prefill_rows",
            "max_model_len",
            "dtype",
            "max_beam_size",
            "max_beam_tokens",
            "onednn_linear",
        }
    )

    @classmethod
    def capabilities_for(cls, options: TransformersOptions) -> Capabilities:
        declared = replace(
            cls.capabilities,
            engine_concurrency=options.max_batch_size,
            context_length=options.max_model_len,
            max_beam_size=options.max_beam_size if options.max_beam_size > 1 else 0,
            max_beam_tokens=options.max_beam_tokens,
        )
        if not options.vision:
            return declared
        images = frozenset({Modality.TEXT, Modality.IMAGE})
        # PEFT adapters are served on text models (a vision model's prefill runs outside them).
        declared = replace(declared, modalities=images, max_images=options.max_images, adapters=False)
        if not options.video:
            return declared
        return replace(declared, modalities=declared.modalities | {Modality.VIDEO}, video_fps=options.video_fps,
                       max_video_frames=options.video_max_frames)  # fmt: skip

    def __init__(self, model: ModelConfig, options: TransformersOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self.adapter_folders = AdapterFolders(model, context.hub)
        self._tokenizer_thread = EngineThread(f"{model.id}-tokenizer")
        self._engine: ContinuousBatcher | None = None
        self._tokenizer: Any = None
        self._processor: Any = None
        self._video_settings: VideoSettings | None = None
        """A vision model's processor (None for a text model)."""
        self._max_len = 0
        self._kv_bytes = 0
        """The batch's KV cache at its fullest (`kv_budget`), known once loaded."""

    async def estimate_memory(self) -> MemoryEstimate:
        """The parameters at the dtype they load in (from the safetensors headers: a float32
        checkpoint loaded in bfloat16 on a GPU takes half its files), plus 10% and 128 MiB
        of working memory (activations), plus the most the batch's KV cache may hold
        (`kv_budget`)."""
        path = await locate(self.model, self.hub)
        dtype_bytes = _dtype_bytes(self.options.dtype, self._device())
        counts = await asyncio.to_thread(safetensors_parameters, path)
        if counts:
            weights = parameters_at(counts, dtype_bytes)
        else:  # GGUF is de-quantised (to float32 on the CPU); .bin checkpoints: as stored
            weights = files_size(path) * (dtype_bytes if path.suffix == ".gguf" else 1)
        if self._packs_linears() and dtype_bytes == 4 and pick_device(self._device()) == "cpu":
            weights += await asyncio.to_thread(_tied_head_parameters, path) * 4  # the packed copy of a tied LM head
        adapters = await asyncio.to_thread(self.adapter_folders.largest_bytes) if self.model.adapters else 0
        kv = await asyncio.to_thread(self._kv_bound, path)
        return estimate_on(self._device(), int(weights * 1.1) + _MiB(128) + kv + adapters, host_bytes=_MiB(128))

    def growth_bound(self) -> MemoryEstimate:
        """The batch's KV cache at its fullest, which the load did not measure (it starts empty)."""
        return estimate_on(self._device(), self._kv_bytes, host_bytes=0)

    def _kv_bound(self, path: Path) -> int:
        """The most the batch's KV cache may hold (0 when the model's shape is not known
        before it loads)."""
        shape = kv_shape(path)
        if shape is None:
            return 0
        dtype_bytes = _dtype_bytes(self.options.dtype, self._device())
        return batch_kv_bytes(shape, dtype_bytes, self._limits(), self.options.max_model_len or DEFAULT_MAX_LEN)

    def _limits(self) -> BatchLimits:
        o = self.options
        return BatchLimits(o.max_batch_size, o.max_batch_tokens, o.prefill_chunk, o.prefill_rows)

    async def start(self) -> None:
        require_engine(self.model.id, ("torch", "transformers"), "transformers")
        path = await locate(self.model, self.hub)
        model, loaded = await in_passing_thread(self._load, path)
        # A vision model loads its processor, which holds its tokenizer.
        self._processor = loaded if self.options.vision else None
        tokenizer = loaded.tokenizer if self.options.vision else loaded
        self._tokenizer = tokenizer
        self._max_len = min(self.options.max_model_len or DEFAULT_MAX_LEN, _model_limit(model))
        self._kv_bytes = await asyncio.to_thread(self._kv_bound, path)
        self._engine = ContinuousBatcher(model, tokenizer, _eos_ids(model, tokenizer), self._limits(), self.model.id)
        if self.model.adapters:
            self._engine.adapters = PeftAdapters(model, max_adapters=self.model.max_adapters, model_id=self.model.id)
            for spec in await asyncio.to_thread(self.adapter_folders.preloaded):
                await self.load_spec(spec)

    async def warmup(self) -> None:
        await drain(self._generate([*await self._encode("Hello")], SamplingParams(max_tokens=1, temperature=0)))

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
        await asyncio.to_thread(self._tokenizer_thread.shutdown)

    async def check_health(self) -> None:
        self._require_engine()

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        started = prompt_clock()
        plan = await TEMPLATE_RENDERS.run(self._plan_chat, request, "model")
        images = [image.image for message in request.messages for image in message.images]
        media = Media(images, [video for message in request.messages for video in message.videos])
        vision: dict[str, Any] | None = None
        if media.images or media.videos:
            prompt, vision = await self._tokenizer_thread.call(
                render_with_media, self._processor, plan, self.options.chat_template, request.template_kwargs,
                media, self._require_engine().model, self._video_settings,
            )  # fmt: skip
        else:
            prompt = await self._tokenizer_thread.call(self._render_chat, plan, request.template_kwargs)
        prompt_seconds = prompt_clock() - started  # with images: their processing too
        constraint = await self._constraint(plan.grammar, grammar_param(request))
        adapter = await self._adapter(request.adapter)
        chunks = self._generate(prompt, request.sampling, param="messages", constraint=constraint, vision=vision,
                                adapter=adapter)  # fmt: skip
        tools = make_parser(plan.parser, live=plan.live) if plan.parser else None
        reasoning = self.model.reasoning_parser
        async for chunk in chat_output(chunks, reasoning=reasoning, tools=tools, prompt_seconds=prompt_seconds):
            yield chunk

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        if isinstance(request.prompt, str):
            prompt = await self._encode(request.prompt) or await self._start_ids()
            echo_text = request.prompt
        else:
            prompt = self._check_ids(request.prompt, "prompt")
            echo_text = await self._tokenizer_thread.call(self._tokenizer.decode, prompt)
        echoed: tuple[TokenLogprob, ...] = ()
        adapter = await self._adapter(request.adapter)
        if request.echo and request.sampling.logprobs is not None:
            echoed = tuple(await self._score(prompt, request.sampling.logprobs, adapter))
        grammar = output_grammar(request.output) if request.output is not None else None
        constraint = await self._constraint(grammar, "response_format")
        chunks = self._generate(prompt, request.sampling, param="prompt", constraint=constraint, adapter=adapter)
        async for chunk in with_echo(chunks, echo_text, echoed) if request.echo else chunks:
            yield chunk

    async def tokenize(self, text: str) -> list[int]:
        return await self._encode(text)

    # ----- tokenizer (POST /tokenize, /detokenize) -------------------------------------

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return await self._tokenizer_thread.call(hf_tokens.encode, self._require_tokenizer(), text, add_special_tokens)

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        plan = await TEMPLATE_RENDERS.run(self._plan_chat, request, "messages")
        variables = request.template_kwargs
        return await self._tokenizer_thread.call(self._render_chat, plan, variables, add_generation_prompt)

    async def decode_tokens(self, ids: list[int]) -> str:
        return await self._tokenizer_thread.call(hf_tokens.decode, self._require_tokenizer(), ids)

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return await self._tokenizer_thread.call(hf_tokens.pieces, self._require_tokenizer(), ids)

    async def max_model_len(self) -> int | None:
        return self._max_len

    async def start_token(self) -> int | None:
        bos = self._require_tokenizer().bos_token_id
        return int(bos) if bos is not None else None

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        return await self._score(tokens, top_n, None)

    # ----- LoRA adapters (PEFT) --------------------------------------------------------

    async def load_adapter(self, name: str) -> None:
        await self.load_spec(await asyncio.to_thread(self.adapter_folders.spec, name))

    async def load_spec(self, spec: AdapterSpec) -> None:
        engine = self._require_engine()
        await asyncio.wrap_future(engine.call(lambda: engine.under_adapter(spec, 1, lambda: None)))

    async def unload_adapter(self, name: str) -> bool:
        engine = self._require_engine()
        if engine.adapters is None:
            return False
        adapters = engine.adapters
        unloaded: bool = await asyncio.wrap_future(engine.call(lambda: adapters.unload(name, engine.adapters_in_use)))
        return unloaded

    def loaded_adapters(self) -> list[str]:
        engine = self._engine
        return engine.adapters.loaded if engine is not None and engine.adapters is not None else []

    def adapter_bytes(self) -> int:
        engine = self._engine
        return engine.adapters.total_bytes() if engine is not None and engine.adapters is not None else 0

    async def _adapter(self, name: str | None) -> AdapterSpec | None:
        """The adapter a request names, its folder resolved (off the loop: `hf:` may download)."""
        return None if name is None else await asyncio.to_thread(self.adapter_folders.spec, name)

    async def _score(self, tokens: list[int], top_n: int, adapter: AdapterSpec | None) -> list[TokenLogprob]:
        engine = self._require_engine()
        self._check_fits(tokens, 0, "prompt")
        work = lambda: score_tokens(engine.model, self._tokenizer, tokens, top_n)  # noqa: E731
        scored = await asyncio.wrap_future(engine.adapter_call(adapter, 1, work))
        return list(scored)

    # ----- internals -----------------------------------------------------------------

    async def _generate(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        param: str = "prompt",
        constraint: TokenConstraint | None = None,
        vision: dict[str, Any] | None = None,
        adapter: AdapterSpec | None = None,
    ) -> AsyncGenerator[GenerationChunk, None]:
        engine = self._require_engine()
        max_new = self._check_fits(prompt, sampling.max_tokens, param)
        if sampling.beam is not None:
            self._check_beam(sampling, vision)
        yield GenerationChunk(prompt_tokens=len(prompt))  # the request fits: what follows is the generation
        if max_new == 0:
            yield GenerationChunk(finish_reason="length", usage=_usage(prompt, 0))
            return
        channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
        sequence = Sequence(
            prompt=prompt,
            params=sampling,
            max_new=max_new,
            out=channel,
            generator=make_generator(sampling.seed, engine.device),
            detok=IncrementalDetokenizer(self._tokenizer, prompt),
            tokenizer=self._tokenizer,
            eos_ids=engine.eos_ids,
            constraint=constraint,
            vision=vision,
            adapter=adapter,
        )
        if sampling.beam is None:
            engine.submit(sequence)
        else:
            self._beam_search(engine, sequence, sampling.beam)
        try:
            async for chunk in chunk_stream(channel):
                yield chunk
        finally:
            channel.cancelled.set()  # a consumer that leaves takes its sequence out of the batch

    def _check_beam(self, sampling: SamplingParams, vision: dict[str, Any] | None) -> None:
        assert sampling.beam is not None
        if vision is not None:
            raise InvalidRequest(f"model '{self.model.id}' has no beam search over images", param=sampling.beam.param)
        check_beam_sampling(sampling, self.model.id)

    @staticmethod
    def _beam_search(engine: ContinuousBatcher, sequence: Sequence, beam: BeamSearch) -> None:
        """The search runs on the engine thread between two steps (see `beam`); were the
        engine closed first, the call fails and so does the sequence."""
        search = lambda: run_beam_search(engine.model, sequence, beam)  # noqa: E731
        future = engine.adapter_call(sequence.adapter, beam.width, search)

        def failed(done: Future[Any]) -> None:
            error = done.exception()
            if error is not None:
                sequence.fail(error)

        future.add_done_callback(failed)

    async def _constraint(self, grammar: str | None, param: str) -> TokenConstraint | None:
        if grammar is None:
            return None
        return await self._tokenizer_thread.call(lambda: self._grammars.start(grammar, param))

    @cached_property
    def _grammars(self) -> GrammarCompiler:
        """Built on the first constrained request (~1 s for a 49k vocabulary), then kept."""
        from llguidance.hf import from_tokenizer

        engine, tokenizer = self._require_engine(), self._require_tokenizer()
        # The logits' width: `out_features` holds for nn.Linear and for a head packed for oneDNN
        # (PackedLinear keeps no `weight`).
        vocab_size = int(engine.model.get_output_embeddings().out_features)
        eos = sorted(engine.eos_ids)
        if not eos:
            raise InvalidRequest(f"model '{self.model.id}' has no end-of-sequence token, so a constrained output "
                                 "could not end; structured output is off for it", param="response_format")  # fmt: skip
        grammar_tokenizer = from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos[0])
        return GrammarCompiler(grammar_tokenizer, vocab_size, eos, eos[0])

    def _plan_chat(self, request: ChatRequest, param: str) -> ChatPlan:
        tokenizer = self._require_tokenizer()
        processor_template = self._processor.chat_template if self._processor is not None else None
        source = self.options.chat_template or processor_template or tokenizer.chat_template
        if not isinstance(source, str):
            raise InvalidRequest(f"model '{self.model.id}' has no chat template; use /v1/completions", param=param)
        return plan_chat(
            request,
            template_source=source,
            configured_parser=self.model.tool_parser,
            constrain_auto=self.model.constrained_auto_tools,
        )

    def _render_chat(
        self, plan: ChatPlan, template_kwargs: Mapping[str, Any], add_generation_prompt: bool = True
    ) -> list[int]:
        tokenizer, template = self._require_tokenizer(), self.options.chat_template
        return chat_prompt_ids(tokenizer, plan, template, template_kwargs, add_generation_prompt)

    async def _encode(self, text: str) -> list[int]:
        return await self._tokenizer_thread.call(encode_text, self._require_tokenizer(), text)

    async def _start_ids(self) -> list[int]:
        return start_of_text(await self.start_token())

    def _check_ids(self, ids: tuple[int, ...], param: str) -> list[int]:
        return check_token_ids(ids, len(self._require_tokenizer()), param)

    def _check_fits(self, prompt: list[int], max_tokens: int | None, param: str) -> int:
        return tokens_to_generate(len(prompt), max_tokens, self._max_len, param)

    def _load(self, path: Path) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if path.is_file() and path.suffix == ".gguf":
            path = hf_folder_for(path, self.hub.work_dir)
        device = pick_device(self._device())
        dtype = _dtype(self.options.dtype, device)
        device_map, trust = self.options.device_map, self.options.trust_remote_code
        if self.options.vision:  # the processor stands in for the tokenizer (it holds one)
            with MODEL_CONSTRUCTION:
                vision_model, processor = load_vision_model(path, dtype, trust, self.model.id, device_map)
            if self.options.video:
                check_video_model(vision_model, self.model.id)
                self._video_settings = video_settings(path, processor.image_processor)
            (vision_model if device_map else vision_model.to(device)).eval()  # accelerate placed it
            torch.set_grad_enabled(False)
            return vision_model, processor
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=self.options.trust_remote_code)
            # transformers' stubs type `.to()` oddly; the model is used through its runtime API.
            with MODEL_CONSTRUCTION:
                model: Any = AutoModelForCausalLM.from_pretrained(
                    path, dtype=dtype, trust_remote_code=trust, device_map=device_map
                )
        except (OSError, ValueError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': transformers could not load {path}: {exc}") from exc
        (model if device_map else model.to(device)).eval()
        torch.set_grad_enabled(False)
        if self._packs_linears():
            self._pack(model)
        return model, tokenizer

    def _packs_linears(self) -> bool:
        """Whether `onednn_linear` applies: text models placed whole (not vision, not device_map)."""
        return self.options.onednn_linear and not self.options.vision and self.options.device_map is None

    def _pack(self, model: Any) -> None:
        """The linears on oneDNN, where the weights allow it (else PyTorch's own, said in the log)."""
        refused = can_pack(model)
        if refused is not None:
            log.info("transformers linears left unpacked", extra={"model": self.model.id, "reason": refused})
            return
        keep = None
        if self.model.adapters:  # PEFT wraps plain `nn.Linear` layers and reads their weights: not those
            keep = self.adapter_folders.adapted_modules()
            if keep is None:
                log.info("transformers linears left unpacked", extra={"model": self.model.id,
                         "reason": "an adapter's targets are known only once it loads"})  # fmt: skip
                return
        extra = pack_linears(model, keep)
        log.info("transformers linears packed for oneDNN", extra={"model": self.model.id, "extra_bytes": extra})

    def _device(self) -> str:
        """Where the weights go: `device`, or with `device_map: auto` the best device there
        is (accelerate fills it first, then the next ones)."""
        return "auto" if self.options.device_map == "auto" else self.options.device

    def placement(self) -> dict[str, str]:
        """Where the loaded weights sit: accelerate's map (module → device) with `device_map`,
        else the one device; empty before the load."""
        if self._engine is None:
            return {}
        return weights_placement(self._engine.model, self._engine.device)

    def _require_engine(self) -> ContinuousBatcher:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._engine

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._tokenizer


def _usage(prompt: list[int], generated: int) -> Usage:
    return Usage(len(prompt), generated)


DEFAULT_MAX_LEN = 8192
"""The longest prompt + completion when `max_model_len` is not set (or the model's own limit if less)."""


def _MiB(count: int) -> int:
    return count * 1024 * 1024


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(int(tokenizer.eos_token_id))
    return found


def _model_limit(model: Any) -> int:
    config = model.config.get_text_config()  # a vision model's language part; the config itself otherwise
    return int(getattr(config, "max_position_embeddings", 0) or DEFAULT_MAX_LEN)


def _dtype_bytes(dtype: str, device: str) -> int:
    """Bytes per floating parameter once loaded, as `_dtype` picks it (auto: float32 on CPU)."""
    if dtype == "auto":
        return 4 if pick_device(device) == "cpu" else 2
    return 4 if dtype == "float32" else 2


def _dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return getattr(torch, dtype)


def _tied_head_parameters(path: Path) -> int:
    """Parameters of the LM head when it is tied to the input embeddings (from a model
    folder's config.json, or a GGUF's tensors; 0 when untied or unknown)."""
    if path.suffix == ".gguf" and path.is_file():
        return _gguf_tied_head_parameters(path)
    config = path / "config.json" if path.is_dir() else None
    if config is None or not config.is_file():
        return 0
    try:
        fields = json.loads(config.read_text())
        text = fields.get("text_config", fields)
        if not text.get("tie_word_embeddings", fields.get("tie_word_embeddings", True)):
            return 0
        return int(text["vocab_size"]) * int(text["hidden_size"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return 0


def _gguf_tied_head_parameters(path: Path) -> int:
    """A GGUF's LM head is tied when it has no `output.weight` tensor (llama.cpp then reuses
    `token_embd.weight`, as transformers does once converted): the embedding's size."""
    import gguf

    try:
        tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(path).tensors}
    except (OSError, ValueError, KeyError) as exc:  # an unreadable file fails its load, with its own error
        log.debug("model file %s: no tensor table read (%s)", path, exc)
        return 0
    embedding = tensors.get("token_embd.weight")
    return 0 if embedding is None or "output.weight" in tensors else int(embedding.n_elements)
