"""`quiet_warnings.ignoring` from an engine thread leaves the filters other threads set
meanwhile in place (the race `catch_warnings` lost: tests/e2e/test_rerank once got a 500)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from modelpool.quiet_warnings import ignoring


class LoopsWarning(UserWarning):
    """What the event loop silences around its own work (FastAPI: pydantic's field warning)."""


class EnginesWarning(UserWarning):
    """What an engine thread silences around a load."""


def engine_thread_inside_loops_block(quiet: Callable[[], AbstractContextManager[object]]) -> None:
    """An engine thread enters its silencing; the loop enters `catch_warnings` with its own
    filter; the engine thread leaves; the loop then warns, still inside its block."""
    entered, loop_in, left = threading.Event(), threading.Event(), threading.Event()

    def engine() -> None:
        with quiet():
            entered.set()
            loop_in.wait(10)
            warnings.warn("engine", EnginesWarning, stacklevel=1)  # silenced
        left.set()

    thread = threading.Thread(target=engine)
    thread.start()
    try:
        assert entered.wait(10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LoopsWarning)
            loop_in.set()
            assert left.wait(10)
            warnings.warn("loop", LoopsWarning, stacklevel=1)  # must still be silenced
    finally:
        loop_in.set()
        thread.join()


def test_an_engine_threads_silencing_keeps_the_loops_filter() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as the tests' filters make every warning
        engine_thread_inside_loops_block(lambda: ignoring(EnginesWarning))


def test_catch_warnings_in_the_engine_thread_loses_it() -> None:
    """What `ignoring` replaces: the same sequence with `catch_warnings` raises the loop's warning."""

    def catching() -> AbstractContextManager[object]:
        block = warnings.catch_warnings()
        return _Entered(block)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LoopsWarning):
            engine_thread_inside_loops_block(catching)


class _Entered:
    def __init__(self, block: warnings.catch_warnings[None]) -> None:
        self.block = block

    def __enter__(self) -> object:
        self.block.__enter__()
        warnings.simplefilter("ignore", EnginesWarning)
        return self

    def __exit__(self, *exc: object) -> None:
        self.block.__exit__(None, None, None)


def test_nested_and_shared_silencing_lasts_until_the_last_leaves() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ignoring(EnginesWarning, "engine"):
            with ignoring(EnginesWarning, "engine"):
                warnings.warn("engine load", EnginesWarning, stacklevel=1)
            warnings.warn("engine load", EnginesWarning, stacklevel=1)  # the outer one still holds
            with pytest.raises(EnginesWarning):
                warnings.warn("other text", EnginesWarning, stacklevel=1)  # only its message is silenced
        with pytest.raises(EnginesWarning):
            warnings.warn("engine load", EnginesWarning, stacklevel=1)  # gone once both left
