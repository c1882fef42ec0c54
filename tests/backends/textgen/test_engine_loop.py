"""The engine thread the kit runs for every in-process LLM engine, driven by a fake batch:
newcomers are taken in between steps, a step that fails fails what it held and the thread
goes on, closing fails what waits or runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from modelpool.backends.textgen.engine_loop import EngineLoop
from modelpool.errors import GenerationFailed, ModelUnloaded


class Request:
    def __init__(self, name: str, steps: int = 1) -> None:
        self.request_id = name
        self.steps = steps
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finished.set()


class FakeBatch(EngineLoop[Request]):
    """Runs every request it holds one step at a time; a request named "boom" breaks the step."""

    engine_name = "a fake"

    def __init__(self, *, hold: bool = False) -> None:
        super().__init__("fake-engine")
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.hold = hold
        """Take requests in but never start them (they wait for room)."""
        self.steps = 0
        self.start_thread()

    def intake(self, arrived: list[Request]) -> None:
        (self.waiting if self.hold else self.running).extend(arrived)

    def taken_in(self) -> list[Request]:
        waiting, self.waiting = self.waiting, []
        return waiting

    def busy(self) -> bool:
        return bool(self.running)

    def step(self) -> None:
        self.steps += 1
        if any(r.request_id == "boom" for r in self.running):
            raise RuntimeError("the forward pass broke")
        for request in self.running:
            request.steps -= 1
            if request.steps == 0:
                request.finished.set()
        self.running = [r for r in self.running if r.steps > 0]

    def fail_all(self, error_for: Callable[[Request], BaseException]) -> None:
        for request in self.running:
            request.fail(error_for(request))
        self.running = []


def test_requests_run_to_their_end_and_calls_run_between_steps() -> None:
    engine = FakeBatch()
    try:
        requests = [Request("a", steps=3), Request("b", steps=1)]
        for request in requests:
            engine.submit(request)
        assert all(r.finished.wait(5) for r in requests)
        assert [r.error for r in requests] == [None, None]
        assert engine.call(lambda: threading.current_thread().name).result(5) == "fake-engine"
    finally:
        engine.stop_thread()


def test_a_failed_step_fails_what_it_held_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeBatch()
    try:
        broken = [Request("boom", steps=5), Request("neighbour", steps=5)]
        for request in broken:
            engine.submit(request)
        assert all(r.finished.wait(5) for r in broken)
        for request in broken:
            assert isinstance(request.error, GenerationFailed) and request.request_id in request.error.message
        assert "a fake step failed" in caplog.text
        later = Request("later", steps=2)
        engine.submit(later)
        assert later.finished.wait(5) and later.error is None
    finally:
        engine.stop_thread()


def test_closing_fails_what_waits_and_refuses_newcomers() -> None:
    engine = FakeBatch(hold=True)
    waiting = Request("waiting")
    engine.submit(waiting)
    assert engine.call(lambda: len(engine.waiting)).result(5) == 1  # taken in, not started
    engine.stop_thread()
    assert isinstance(waiting.error, ModelUnloaded)
    with pytest.raises(ModelUnloaded):
        engine.submit(Request("too late"))
