"""CTranslate2Backend: causal LMs on CTranslate2 (int8 on the CPU, int8_float16 on a GPU),
batched, every request streamed on its own.

Source: a CT2 folder (model.bin + config.json) as it is, or a Hugging Face causal LM folder
or a GGUF, converted once into the work dir (see `convert`). The tokenizer and the chat
template come from the Hugging Face files copied next to the weights.

What CT2 4.8 cannot do is refused with a 400 rather than ignored: it has no per-request
random seed (`set_random_seed` is process-wide and does not reseed its threads' generators,
so a seed reproduces nothing), no presence/frequency penalty, no min-p, and no hook on the
logits during generation, so no tool calling or structured output (declared False: the
runtime refuses those requests). Greedy decoding, temperature/top-k/top-p, repetition
penalty, stop strings, min_tokens/ignore_eos and logprobs with alternatives are supported,
and CT2's own beam search (`beam_size` > 1: a batch of its own, answered whole at its end;
see `engine`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends import hf_tokens
from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.ctranslate2.convert import ComputeType, ct2_folder_for, read_facts
from modelpool.backends.ctranslate2.engine import BatchEngine, BatchPolicy
from modelpool.backends.ctranslate2.rows import Row
from modelpool.backends.ctranslate2.scoring import score_tokens
from modelpool.backends.requirements import require_engine
from modelpool.backends.textgen.channel import Channel, chunk_stream
from modelpool.backends.textgen.decoding import check_token_ids, start_of_text, tokens_to_generate, with_echo
from modelpool.backends.textgen.detokenize import IncrementalDetokenizer
from modelpool.backends.textgen.hf_text import chat_prompt_ids, encode_text
from modelpool.backends.textgen.pipeline import chat_output, prompt_clock
from modelpool.backends.threads import EngineThread, drain, in_passing_thread
from modelpool.capabilities import Capabilities
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate, resolve_source
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import (
    DEFAULT_MAX_BEAM_SIZE,
    DEFAULT_MAX_BEAM_TOKENS,
    MAX_BEAM_SIZE,
    MAX_BEAM_TOKENS,
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
from modelpool.tools.prompt import ChatPlan, plan_chat

_DEFAULT_CONTEXT = 4096
"""The limit when neither the options nor the model's files say one."""


class CTranslate2Options(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """cpu, cuda, or auto (CUDA when CTranslate2 sees a GPU)."""
    device_index: int = Field(default=0, ge=0)
    """Which GPU (device cuda)."""
    compute_type: ComputeType = "auto"
    """CTranslate2 compute type; auto: int8 on the CPU, int8_float16 on a GPU. A model that is
    converted here is quantized to it (a change converts again)."""
    inter_threads: int = Field(default=2, ge=1)
    """Batches that run at once. A request that arrives while they all run waits for one to
    end (CT2 cannot add rows to a running batch), so a second worker keeps that wait short."""
    intra_threads: int = Field(default=0, ge=0)
    """CPU threads per batch (0: the CPU cores divided among `inter_threads`)."""
    max_batch_size: int = Field(default=32, ge=1)
    """Most requests in one batch."""
    max_prompt_spread: int = Field(default=8, ge=0)
    """Most tokens between the shortest and the longest prompt of a batch. CT2 feeds a longer
    prompt's extra tokens one decode step at a time, which delays its first token and, in
    int8, can change its greedy answer a little; 0 batches equal lengths only (every greedy
    answer then equals the one it gets alone)."""
    batch_gather_ms: float = Field(default=5.0, ge=0)
    """A free worker waits for more requests while they keep arriving less than this apart
    (at most 10x this in all), so a burst runs as one batch rather than one request alone
    and the rest after it; a lone request waits this long once."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + completion (default: the model's own limit, else 4096)."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's."""
    tokenizer: str | None = None
    """Where the Hugging Face tokenizer is (a path, package: or hf: source), for a CT2 folder
    that has no tokenizer files of its own."""
    max_beam_size: int = Field(default=DEFAULT_MAX_BEAM_SIZE, ge=1, le=MAX_BEAM_SIZE)
    """Widest beam search a request may ask (`beam_size`; 1: none). A beam batch holds
    this many sequences per request, so memory and time grow with it."""
    max_beam_tokens: int = Field(default=DEFAULT_MAX_BEAM_TOKENS, ge=1, le=MAX_BEAM_TOKENS)
    """Longest answer a beam search request may ask (`max_tokens`; more: a 400 naming it;
    none set: cut here). It cannot be stopped midway: a
    client that leaves, an unload or a shutdown waits for its end."""
    seeds: Literal["reject", "ignore"] = "reject"
    """CT2 has no per-request seed. reject: a sampled request with a `seed` is a 400;
    ignore: it is sampled unseeded (not reproducible). Greedy requests may always carry one."""


class CTranslate2Backend(DeclaredBackend):
    """Batches of requests that share decoding settings; see `engine` for how and why."""

    Options = CTranslate2Options
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        prompt_scoring=True,
        tools=False,
        structured_output=False,
        tokenizer=True,
        max_beam_size=DEFAULT_MAX_BEAM_SIZE,
        max_beam_tokens=DEFAULT_MAX_BEAM_TOKENS,
    )
    overridable = frozenset(
        {"compute_type", "inter_threads", "intra_threads", "max_batch_size", "max_prompt_spread", "batch_gather_ms",
         "max_model_len", "chat_template", "seeds", "max_beam_size", "max_beam_tokens"}
    )  # fmt: skip

    @classmethod
    def capabilities_for(cls, options: CTranslate2Options) -> Capabilities:
        # Requests decoding at once: a full batch on every worker.
        running = options.max_batch_size * options.inter_threads
        return replace(cls.capabilities, engine_concurrency=running, context_length=options.max_model_len,
                       max_beam_size=options.max_beam_size if options.max_beam_size > 1 else 0,
                       max_beam_tokens=options.max_beam_tokens)  # fmt: skip

    def __init__(self, model: ModelConfig, options: CTranslate2Options, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self._thread = EngineThread(f"{model.id}-tokenizer")
        """Tokenizing, rendering templates and scoring: off the event loop, one at a time."""
        self._engine: BatchEngine | None = None
        self._tokenizer: Any = None
        self._end_ids: frozenset[int] = frozenset()
        self._max_len = 0

    async def estimate_memory(self) -> MemoryEstimate:
        path = await locate(self.model, self.hub)
        size = files_size(path)
        if path.suffix == ".gguf":
            size = size * 3 // 2  # 4-5 bit weights become 8-bit ones
        elif not (path / "model.bin").is_file():
            size //= 2  # 16-bit Hugging Face weights quantized to 8 bits
        working = size + 128 * 1024 * 1024
        if _device(self.options.device) == "cuda":
            return MemoryEstimate(ram_bytes=128 * 1024 * 1024, gpu_bytes=working)
        return MemoryEstimate(ram_bytes=working)

    async def start(self) -> None:
        require_engine(self.model.id, ("ctranslate2", "transformers"), "ctranslate2")
        path = await locate(self.model, self.hub)
        self._engine = await in_passing_thread(self._load, path)

    async def warmup(self) -> None:
        await drain(self._generate(await self._encode("Hello"), SamplingParams(max_tokens=1, temperature=0)))

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        self._require_engine()

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        started = prompt_clock()
        plan = await TEMPLATE_RENDERS.run(self._plan_chat, request, "model")
        if request.output is not None:
            raise InvalidRequest(f"model '{self.model.id}' does not support structured output", param="response_format")
        prompt = await self._thread.call(self._render_chat, plan, request.template_kwargs)
        prompt_seconds = prompt_clock() - started
        chunks = self._generate(prompt, request.sampling, param="messages")
        reasoning = self.model.reasoning_parser  # and no tools in CT2
        async for chunk in chat_output(chunks, reasoning=reasoning, tools=None, prompt_seconds=prompt_seconds):
            yield chunk

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        if request.output is not None:
            raise InvalidRequest(f"model '{self.model.id}' does not support structured output", param="response_format")
        if isinstance(request.prompt, str):
            prompt = await self._encode(request.prompt) or await self._start_ids()
            echo_text = request.prompt
        else:
            prompt = self._check_ids(request.prompt, "prompt") or await self._start_ids()
            echo_text = await self._thread.call(self._tokenizer.decode, prompt)
        # Before scoring an echo: a refused request costs nothing.
        check_sampling(request.sampling, self.model.id, self.options.seeds)
        echoed: tuple[TokenLogprob, ...] = ()
        if request.echo and request.sampling.logprobs is not None:
            echoed = tuple(await self.score_tokens(prompt, request.sampling.logprobs))
        chunks = self._generate(prompt, request.sampling, param="prompt")
        async for chunk in with_echo(chunks, echo_text, echoed) if request.echo else chunks:
            yield chunk

    async def tokenize(self, text: str) -> list[int]:
        return await self._encode(text)

    # ----- tokenizer (POST /tokenize, /detokenize) -------------------------------------

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        return await self._thread.call(hf_tokens.encode, self._require_tokenizer(), text, add_special_tokens)

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        plan = await TEMPLATE_RENDERS.run(self._plan_chat, request, "messages")
        return await self._thread.call(self._render_chat, plan, request.template_kwargs, add_generation_prompt)

    async def decode_tokens(self, ids: list[int]) -> str:
        self._check_ids(tuple(ids), "tokens")  # the CT2 vocabulary may be smaller than the tokenizer's
        return await self._thread.call(hf_tokens.decode, self._require_tokenizer(), ids)

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return await self._thread.call(hf_tokens.pieces, self._require_tokenizer(), ids)

    async def max_model_len(self) -> int | None:
        return self._max_len

    async def start_token(self) -> int | None:
        bos = self._require_tokenizer().bos_token_id
        return int(bos) if bos is not None else None

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        engine = self._require_engine()
        tokens = self._check_ids(tuple(tokens), "prompt")
        tokens_to_generate(len(tokens), 0, self._max_len, "prompt")
        return await self._thread.call(score_tokens, engine.generator, self._tokenizer, tokens, top_n)

    # ----- internals -----------------------------------------------------------------

    async def _generate(
        self, prompt: list[int], sampling: SamplingParams, param: str = "prompt"
    ) -> AsyncGenerator[GenerationChunk, None]:
        engine = self._require_engine()
        check_sampling(sampling, self.model.id, self.options.seeds)
        max_new = tokens_to_generate(len(prompt), sampling.max_tokens, self._max_len, param)
        self._check_ids(tuple(prompt), param)  # a tokenizer may know ids the CT2 vocabulary lacks
        yield GenerationChunk(prompt_tokens=len(prompt))  # the request fits: what follows is the generation
        if max_new == 0:
            yield GenerationChunk(finish_reason="length", usage=_usage(prompt))
            return
        channel: Channel[GenerationChunk] = Channel(asyncio.get_running_loop())
        detok = IncrementalDetokenizer(self._tokenizer, prompt)
        engine.submit(Row(prompt, sampling, max_new, channel, detok, self._tokenizer, self._end_ids))
        async for chunk in chunk_stream(channel):  # leaving sets channel.cancelled: the row stops
            yield chunk

    def _plan_chat(self, request: ChatRequest, param: str) -> ChatPlan:
        source = self.options.chat_template or self._require_tokenizer().chat_template
        if not isinstance(source, str):
            raise InvalidRequest(f"model '{self.model.id}' has no chat template; use /v1/completions", param=param)
        return plan_chat(request, template_source=source, configured_parser=None, constrain_auto=False)

    def _render_chat(
        self, plan: ChatPlan, template_kwargs: Mapping[str, Any], add_generation_prompt: bool = True
    ) -> list[int]:
        tokenizer, template = self._require_tokenizer(), self.options.chat_template
        return chat_prompt_ids(tokenizer, plan, template, template_kwargs, add_generation_prompt)

    async def _encode(self, text: str) -> list[int]:
        return await self._thread.call(encode_text, self._require_tokenizer(), text)

    async def _start_ids(self) -> list[int]:
        return start_of_text(await self.start_token())

    def _check_ids(self, ids: tuple[int, ...], param: str) -> list[int]:
        return check_token_ids(ids, len(self._require_engine().vocabulary), param)

    def _load(self, source: Path) -> BatchEngine:
        """On a thread: convert if needed, then load the tokenizer and the CT2 generator."""
        opts = self.options
        device = _device(opts.device)
        compute_type = _compute_type(opts.compute_type, device)
        try:
            folder = ct2_folder_for(source, self.hub.work_dir, compute_type)
        except ModelLoadFailed as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': {exc.message}") from exc
        try:
            tokenizer = self._load_tokenizer(folder)
            generator = self._load_generator(folder, device, compute_type)
            vocabulary = _vocabulary(folder)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': CTranslate2 could not load {folder}: {exc}") from exc
        facts = read_facts(folder)
        eos = tokenizer.eos_token_id
        self._tokenizer = tokenizer
        self._end_ids = frozenset(facts.end_ids) | (frozenset({int(eos)}) if eos is not None else frozenset())
        self._max_len = opts.max_model_len or facts.context_length or _DEFAULT_CONTEXT
        gather_s = opts.batch_gather_ms / 1000
        policy = BatchPolicy(opts.inter_threads, opts.max_batch_size, opts.max_prompt_spread, gather_s)
        return BatchEngine(generator, vocabulary, self._end_ids, policy)

    def _load_tokenizer(self, folder: Path) -> Any:
        from transformers import AutoTokenizer

        where = self.options.tokenizer
        path = resolve_source(where, model_id=self.model.id, hub=self.hub) if where else folder
        return AutoTokenizer.from_pretrained(path)

    def _load_generator(self, folder: Path, device: str, compute_type: str) -> Any:
        import ctranslate2

        opts = self.options
        # Each batch runs on its own CT2 worker; by default the cores are shared among them.
        intra = opts.intra_threads or max(1, (os.cpu_count() or 1) // opts.inter_threads)
        return ctranslate2.Generator(
            str(folder),
            device=device,
            device_index=opts.device_index,
            compute_type=compute_type,
            inter_threads=opts.inter_threads,
            intra_threads=intra,
        )

    def _require_engine(self) -> BatchEngine:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._engine

    def _require_tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._tokenizer


def check_sampling(sampling: SamplingParams, model_id: str, seeds: str) -> None:
    """What CT2 cannot do is a 400 naming the field, never silently ignored."""
    unsupported = {
        "presence_penalty": sampling.presence_penalty != 0,
        "frequency_penalty": sampling.frequency_penalty != 0,
        "min_p": sampling.min_p != 0,
    }
    for field, asked in unsupported.items():
        if asked:
            raise InvalidRequest(f"model '{model_id}' (CTranslate2) does not support {field}", param=field)
    sampled = sampling.temperature != 0 and sampling.top_k != 1
    if sampling.seed is not None and sampled and seeds == "reject":
        raise InvalidRequest(
            f"model '{model_id}' (CTranslate2) cannot reproduce a seeded sample: CTranslate2 has no per-request "
            "seed. Leave out `seed`, or use temperature 0 (greedy is reproducible)",
            param="seed",
        )


def _usage(prompt: list[int]) -> Usage:
    return Usage(len(prompt), 0)


def _device(device: str) -> str:
    if device != "auto":
        return device
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def _compute_type(compute_type: str, device: str) -> str:
    if compute_type != "auto":
        return compute_type
    return "int8_float16" if device == "cuda" else "int8"


def _vocabulary(folder: Path) -> list[str]:
    """The model's own id → token string table (CT2 takes prompts as token strings)."""
    if (folder / "vocabulary.json").is_file():
        tokens = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
        return [str(token) for token in tokens]
    lines = (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines
