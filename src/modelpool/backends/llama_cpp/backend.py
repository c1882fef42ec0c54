"""LlamaCppBackend: GGUF models for chat and completions, on a thread of their own."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.constraint import TokenConstraint
from modelpool.backends.context import BackendContext
from modelpool.backends.decoding import with_echo
from modelpool.backends.llama_cpp.chat_template import ChatTemplate
from modelpool.backends.llama_cpp.engine import LlamaEngine
from modelpool.backends.llama_cpp.vision import ImageProjector, with_markers
from modelpool.backends.requirements import require_engine
from modelpool.backends.threads import EngineThread, drain
from modelpool.capabilities import Capabilities, Modality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import InvalidRequest, ModelLoadFailed
from modelpool.inference import ChatRequest, CompletionRequest, GenerationChunk, SamplingParams, TokenLogprob
from modelpool.tasks import Task
from modelpool.tools.grammar import grammar_param, output_grammar
from modelpool.tools.parsers import make_parser
from modelpool.tools.prompt import plan_chat
from modelpool.tools.stream import with_tool_calls

# Rough: small models need ~25 KiB of f16 KV cache per token, 7B ones ~500 KiB. A
# measurement after loading replaces the estimate; set `memory_bytes` to be exact.
_KV_BYTES_PER_TOKEN_GUESS = 64 * 1024


class LlamaCppOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n_ctx: int = Field(default=4096, ge=16)
    """Context length in tokens (prompt + completion)."""
    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for generation (default: all cores)."""
    n_batch: int = Field(default=512, ge=1)
    """Prompt tokens evaluated per step."""
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
    reuse_prompt_cache: bool = False
    """Reuse the KV cache of a shared prompt prefix. Faster for long multi-turn chats, but
    the output of a seeded or greedy request may then differ at near-ties."""


class LlamaCppBackend(DeclaredBackend):
    Options = LlamaCppOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        prompt_scoring=True,
        tools=True,
        structured_output=True,
    )
    overridable = frozenset(
        {"n_ctx", "n_threads", "n_batch", "n_gpu_layers", "chat_template", "reuse_prompt_cache", "max_images"}
    )

    @classmethod
    def capabilities_for(cls, options: LlamaCppOptions) -> Capabilities:
        declared = replace(cls.capabilities, context_length=options.n_ctx)  # one context: one request at a time
        if options.mmproj is None:
            return declared
        return replace(declared, modalities=frozenset({Modality.TEXT, Modality.IMAGE}), max_images=options.max_images)

    def __init__(self, model: ModelConfig, options: LlamaCppOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self.tasks = context.tasks
        self._thread = EngineThread(model.id)
        self._engine: LlamaEngine | None = None
        self._template: ChatTemplate | None = None
        self._projector: ImageProjector | None = None

    async def estimate_memory(self) -> MemoryEstimate:
        """The GGUF plus a KV cache for the context, before loading (a measurement replaces the
        RAM part). With layers offloaded, the GPU holds them (all of them for -1)."""
        path = await locate(self.model, self.hub)
        total = files_size(path) + self.options.n_ctx * _KV_BYTES_PER_TOKEN_GUESS + 32 * 1024 * 1024
        if self.options.n_gpu_layers == 0:
            return MemoryEstimate(ram_bytes=total)
        return MemoryEstimate(ram_bytes=32 * 1024 * 1024, gpu_bytes=total)

    async def warmup(self) -> None:
        engine = self._require_engine()
        prompt = await self._thread.call(engine.tokenize, "Hello", add_bos=True)
        warm = SamplingParams(max_tokens=1, temperature=0.0)
        await drain(self._thread.stream(lambda cancel: engine.generate(prompt, warm, cancel, param="prompt")))

    async def start(self) -> None:
        require_engine(self.model.id, ("llama_cpp",), "llama")
        path = await locate(self.model, self.hub)
        self._engine = await self._thread.call(self._load, str(path))
        if Task.CHAT in self.tasks:
            self._template = self._chat_template()
        if self.options.mmproj is not None:
            self._projector = await self._thread.call(self._load_projector, self.options.mmproj)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        projector, self._projector = self._projector, None
        if projector is not None:
            await self._thread.call(projector.close)
        if engine is not None:
            await self._thread.call(engine.llm.close)
        await asyncio.to_thread(self._thread.shutdown)

    async def check_health(self) -> None:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")

    async def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        engine, template = self._require_engine(), self._template
        if template is None:
            raise InvalidRequest(f"model '{self.model.id}' has no chat template; use /v1/completions", param="model")
        plan = plan_chat(
            request,
            template_source=template.source,
            configured_parser=self.model.tool_parser,
            constrain_auto=self.model.constrained_auto_tools,
        )
        images = [image.image for message in request.messages for image in message.images]
        projector = self._projector
        messages = with_markers(plan.messages, projector.marker) if projector is not None else plan.messages
        prompt_text = template.render(messages, plan.tools, **request.template_kwargs)
        constraint = await self._constraint(plan.grammar, grammar_param(request))
        add_bos, sampling = self._add_bos(prompt_text), request.sampling
        if images and projector is not None:
            chunks = self._thread.stream(
                lambda cancel: engine.generate_with_images(
                    projector, prompt_text, images, sampling, cancel, add_bos=add_bos, constraint=constraint
                )
            )
        else:
            prompt = await self._thread.call(engine.tokenize, prompt_text, add_bos=add_bos)
            chunks = self._thread.stream(
                lambda cancel: engine.generate(prompt, sampling, cancel, param="messages", constraint=constraint)
            )
        async for chunk in with_tool_calls(chunks, make_parser(plan.parser, live=plan.live)) if plan.parser else chunks:
            yield chunk

    async def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        engine = self._require_engine()
        if isinstance(request.prompt, str):
            prompt = await self._thread.call(engine.tokenize, request.prompt, add_bos=self._add_bos(request.prompt))
            echo_text = request.prompt
        else:
            prompt = engine.check_token_ids(request.prompt, param="prompt")
            echo_text = await self._thread.call(engine.token_text, prompt)
        prompt = engine.start_of(prompt, "prompt")
        echoed: tuple[TokenLogprob, ...] = ()
        if request.echo and request.sampling.logprobs is not None:
            echoed = tuple(await self._thread.call(engine.score_tokens, prompt, request.sampling.logprobs))
        grammar = output_grammar(request.output) if request.output is not None else None
        constraint = await self._constraint(grammar, "response_format")
        chunks = self._thread.stream(
            lambda cancel: engine.generate(prompt, request.sampling, cancel, param="prompt", constraint=constraint)
        )
        async for chunk in with_echo(chunks, echo_text, echoed) if request.echo else chunks:
            yield chunk

    async def tokenize(self, text: str) -> list[int]:
        return await self._thread.call(self._require_engine().tokenize, text, add_bos=False)

    async def start_token(self) -> int | None:
        bos = self._require_engine().llm.token_bos()
        return bos if bos >= 0 else None

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        engine = self._require_engine()
        return await self._thread.call(engine.score_tokens, engine.check_token_ids(tuple(tokens), "prompt"), top_n)

    async def _constraint(self, grammar: str | None, param: str) -> TokenConstraint | None:
        if grammar is None:
            return None
        engine = self._require_engine()
        return await self._thread.call(lambda: engine.grammars.start(grammar, param))

    def _load_projector(self, path: str) -> ImageProjector:
        opts = self.options
        return ImageProjector(self._require_engine().llm, path, n_threads=opts.n_threads or os.cpu_count() or 1,
                              use_gpu=opts.n_gpu_layers != 0, model_id=self.model.id)  # fmt: skip

    def _load(self, path: str) -> LlamaEngine:
        from llama_cpp import Llama

        opts = self.options
        try:
            llm = Llama(
                model_path=path,
                n_ctx=opts.n_ctx,
                n_threads=opts.n_threads or os.cpu_count() or 1,
                n_batch=opts.n_batch,
                n_gpu_layers=opts.n_gpu_layers,
                use_mmap=opts.use_mmap,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadFailed(f"model '{self.model.id}': llama.cpp could not load {path}: {exc}") from exc
        return LlamaEngine(llm, reuse_prompt_cache=opts.reuse_prompt_cache)

    def _chat_template(self) -> ChatTemplate | None:
        llm = self._require_engine().llm
        source = self.options.chat_template or llm.metadata.get("tokenizer.chat_template")
        if not source:
            return None
        return ChatTemplate(
            source, bos_token=self._token_text(llm.token_bos()), eos_token=self._token_text(llm.token_eos())
        )

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._require_engine().llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    def _add_bos(self, text: str) -> bool:
        """Add BOS when the model asks for it, unless the text (a rendered template) has it."""
        llm = self._require_engine().llm
        if not llm._model.add_bos_token():
            return False
        bos = self._token_text(llm.token_bos())
        return not (bos and text.startswith(bos))

    def _require_engine(self) -> LlamaEngine:
        if self._engine is None:
            raise ModelLoadFailed(f"model '{self.model.id}' is not loaded")
        return self._engine
