"""The engine thread every in-process LLM engine runs: requests arrive from any thread,
the thread takes them in between two steps, runs the calls it was handed (scoring,
warmups, status questions), then one step of the batch; a step that fails as a whole
fails every sequence in it (their clients told only their request id, the log the
detail) and the thread goes on. Closing fails what still runs with `ModelUnloaded`.

An engine supplies only its batch: how newcomers join (`intake`), one step (prefill and
decode), and failing everything it holds (`fail_all`)."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, Protocol, TypeVar

from modelpool.backends.textgen.step_failure import generation_failed
from modelpool.errors import ModelUnloaded

log = logging.getLogger("modelpool.backends")


class Request(Protocol):
    """What the loop needs of a request it holds."""

    request_id: str

    def fail(self, error: BaseException) -> None: ...


R = TypeVar("R", bound=Request)
UNLOADED = "the model was unloaded while this request ran"


class EngineLoop(ABC, Generic[R]):
    engine_name = "an engine"
    """Names the engine in the log ("a llama.cpp step failed")."""

    def __init__(self, thread_name: str) -> None:
        self._cond = threading.Condition()
        self._incoming: deque[R] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    # ----- what an engine supplies (on the engine thread) ----------------------------

    @abstractmethod
    def intake(self, arrived: list[R]) -> None:
        """Requests submitted since the last step, in order; they wait for admission."""

    @abstractmethod
    def busy(self) -> bool:
        """Whether a step has work (sequences waiting or running)."""

    @abstractmethod
    def step(self) -> None:
        """One step of the batch: admit, prefill, decode, publish, release."""

    @abstractmethod
    def fail_all(self, error_for: Callable[[R], BaseException]) -> None:
        """Fail every request the engine holds (waiting or running) and forget them."""

    def taken_in(self) -> list[R]:
        """Requests taken in but not started, handed back at shutdown (`fail_all` fails the rest)."""
        return []

    def thread_context(self) -> AbstractContextManager[Any]:
        """Entered around the thread's whole life (torch's inference mode)."""
        return nullcontext()

    # ----- from other threads --------------------------------------------------------

    def start_thread(self) -> None:
        self._thread.start()

    def submit(self, request: R) -> None:
        with self._cond:
            if self._stopping:
                raise ModelUnloaded("the model was unloaded")
            self._incoming.append(request)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread between two steps."""
        future: Future[Any] = Future()
        with self._cond:
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def stop_thread(self) -> None:
        """Stop the engine thread, failing what still runs or waits."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    @property
    def submitted(self) -> int:
        """Requests submitted and not yet taken in by the engine thread (a snapshot)."""
        return len(self._incoming)

    # ----- the engine thread ---------------------------------------------------------

    def _run(self) -> None:
        with self.thread_context():
            while (calls := self._wait_for_work()) is not None:
                for fn, future in calls:
                    _run_call(fn, future)
                try:
                    self.step()
                except Exception as exc:  # the batch's forward: which sequence caused it cannot be told
                    log.error("%s step failed: %r", self.engine_name, exc, exc_info=exc)
                    self.fail_all(lambda request: generation_failed(request.request_id))
            self.fail_all(lambda _: ModelUnloaded(UNLOADED))
        with self._cond:
            waiting, calls = [*self.taken_in(), *self._incoming], list(self._calls)
            self._incoming.clear()
            self._calls.clear()
        for request in waiting:
            request.fail(ModelUnloaded("the model was unloaded"))
        for _, future in calls:
            future.set_exception(ModelUnloaded("the model was unloaded"))

    def _wait_for_work(self) -> list[tuple[Callable[[], Any], Future[Any]]] | None:
        """The calls to run before the next step, once there is work; None when stopping.
        Newcomers go to the engine's `intake` first."""
        with self._cond:
            while not (self._stopping or self._incoming or self._calls or self.busy()):
                self._cond.wait()
            if self._stopping:
                return None
            arrived = list(self._incoming)
            self._incoming.clear()
            calls = list(self._calls)
            self._calls.clear()
        if arrived:
            self.intake(arrived)
        return calls


def _run_call(fn: Callable[[], Any], future: Future[Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
