"""Bounded executors for work whose cost a client controls, so the event loop only routes.

A JSON-schema check, a chat-template render, a grammar compile or an image decode takes
time in proportion to what the client sent. Run on the event loop, one such request stalls
every other client (an 829 KB schema held the loop 7.4 s). Each kind of work gets its own
small pool of threads here, named for what it bounds, so that:

- the loop only waits on a future (`/healthz` answers while the work runs);
- at most `workers` jobs of a kind run at once in the whole process, whatever the number
  of requests: the pools are server-wide budgets, not per request or per model, and a
  flood of one kind queues behind its own pool without taking the threads of the others;
- a job still queued when its request goes away (client gone, sibling failed) is dropped
  before it starts: cancelling the awaiting task cancels the queued job.

Pure-Python CPU work (the JSON-schema metaschema check) runs in child processes instead
(`BoundedProcesses`): in a thread it would still hold the interpreter lock, and the loop
would wait for the lock between every read and write it makes.

The pools are process-wide on purpose (one budget for the whole server) and start their
threads or processes lazily, on the first job of their kind.
"""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")

CHILD_NICENESS = 10
"""Added to the nice value of the child processes: they run when the server does not."""
PARENT_POLL_S = 1.0
"""How often a child process looks whether its parent is still there."""


class BoundedExecutor:
    """At most `workers` jobs of one kind at once, off the event loop; more wait in order."""

    def __init__(self, name: str, workers: int) -> None:
        self.name = name
        self.workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._running = 0
        self._waiting = 0

    @property
    def running(self) -> int:
        """Jobs running now (at most `workers`)."""
        with self._lock:
            return self._running

    @property
    def waiting(self) -> int:
        """Jobs queued behind them, not started."""
        with self._lock:
            return self._waiting

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of this pool's threads, with the caller's context variables
        (tracing, logging fields). Cancelling the caller drops the job if it has not started;
        a job already running finishes on its thread and its result is dropped."""
        context = contextvars.copy_context()
        with self._lock:
            self._waiting += 1
        future = self._pool().submit(self._counted, context.run, fn, *args)
        future.add_done_callback(self._dropped)
        return await asyncio.wrap_future(future)

    def _counted(self, call: Callable[..., T], *args: Any) -> T:
        with self._lock:
            self._waiting -= 1
            self._running += 1
        try:
            return call(*args)
        finally:
            with self._lock:
                self._running -= 1

    def _dropped(self, future: Future[Any]) -> None:
        if future.cancelled():  # never started: it leaves the queue here
            with self._lock:
                self._waiting -= 1

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=f"modelpool-{self.name}")
            return self._executor


class BoundedProcesses:
    """At most `workers` jobs at once in child processes of this one. On Linux the children
    fork from a fork server that imports only `preload` (not the server, and not its
    `__main__`: a child costs ~30 MB, not a second modelpool); elsewhere they are spawned.
    Either way no lock or thread of the server is copied half-held, and they exit when the
    server does, however it ends. `fn` and its arguments and result cross by pickle: keep
    them small (text, not objects)."""

    def __init__(self, name: str, workers: int, preload: tuple[str, ...]) -> None:
        self.name = name
        self.workers = workers
        self._preload = preload
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a child, waiting for it here (call it from a worker thread, never on
        the loop). A child that died (killed for memory) is replaced and the job tried once more."""
        pool = self._pool()
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool:
            self._replace(pool)
            return self._pool().submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a child, awaited (on the loop). Cancelling drops a job not started."""
        pool = self._pool()
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except BrokenProcessPool:
            self._replace(pool)
            return await asyncio.wrap_future(self._pool().submit(fn, *args))

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers, mp_context=self._context(), initializer=_child_started, initargs=(os.getpid(),)
                )
            return self._executor

    def _context(self) -> multiprocessing.context.BaseContext:
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return multiprocessing.get_context("spawn")
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(self._preload))
        return context

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Drop `broken`, if it is still the pool: two jobs that both saw it break must not
        have the second shut down the new pool the first made (cancelling its retry)."""
        with self._lock:
            if self._executor is not broken:
                return
            self._executor = None
        broken.shutdown(wait=False, cancel_futures=True)


def _child_started(server_pid: int) -> None:
    """In each child: niced, so that on a machine with few cores a flood of checks slows other
    checks, not the routing; and gone soon after the server is, however it ended (a server
    killed with SIGKILL tells nobody, and a fork server's children keep the fork server
    alive, so a thread watches the server's pid itself)."""
    os.nice(CHILD_NICENESS)

    def watch() -> None:
        while _alive(server_pid):
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's: the pid was reused
        return False
    return True


REQUEST_CHECKS = BoundedExecutor("request-checks", workers=2)
"""Turning a request body into a pool request: the size walks of its schemas, and waiting
for their metaschema checks (`SCHEMA_CHECKS`)."""

SCHEMA_CHECKS = BoundedProcesses("schema-checks", workers=2, preload=("modelpool.tools.metaschema",))
"""JSON-schema metaschema checks of `tools` and `response_format` (pure Python, ~0.1 ms of
CPU per subschema, so up to about a second for a schema at `server.max_schema_nodes`), in
two child processes, so that the loop keeps the interpreter lock to itself."""

TEMPLATE_RENDERS = BoundedExecutor("template-renders", workers=2)
"""Chat templates (Jinja over the request's messages and tools) and the tool plans and
grammar texts built from the request's schemas."""

GRAMMAR_COMPILES = BoundedExecutor("grammar-compiles", workers=2)
"""llguidance grammar compiles (a schema's grammar against a model's vocabulary)."""

IMAGE_DECODES = BoundedExecutor("image-decodes", workers=2)
"""base64 and Pillow decodes of request images. Two at a time in the whole server, so the
pixels being decoded at once are at most twice `server.max_image_pixels`."""

VIDEO_DECODES = BoundedExecutor("video-decodes", workers=2)
"""PyAV reads of request videos: the header checks, and the decodes into sampled frames."""

AUDIO_DECODES = BoundedExecutor("audio-decodes", workers=2)
"""PyAV decodes of uploaded audio (the counting pass and the fill pass of each upload)."""


async def all_or_none(items: Sequence[T], job: Callable[[T], Awaitable[U]]) -> list[U]:
    """`job(item)` for every item at once, results in order. The first failure cancels the
    others (TaskGroup semantics, which Python 3.10 lacks) and is raised as itself; nothing
    started here outlives the call, whether it returns, raises or is cancelled."""
    if not items:
        return []
    tasks = [asyncio.ensure_future(job(item)) for item in items]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = None if not task.done() or task.cancelled() else task.exception()
            if error is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()  # a no-op for those done
        await asyncio.gather(*tasks, return_exceptions=True)
