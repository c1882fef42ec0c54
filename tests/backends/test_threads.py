from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

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
