"""A model slot: one configured model, its backend and its load state.

    unloaded ──ensure_ready()──► loading ──► ready ──unload()──► unloading ──► unloaded
                                    └──────► failed (error kept, with when)

The slot decides for itself whether a start is needed; callers never read `state` and
then act on it. Concurrent first requests share one load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from enum import Enum

from modelpool.backends.base import Backend
from modelpool.config.schema import ModelConfig
from modelpool.errors import ModelLoadFailed, ModelNotReady, ModelpoolError
from modelpool.runtime.metrics import Metrics
from modelpool.tasks import Task

log = logging.getLogger("modelpool.runtime")


class SlotState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


_ALL_STATES = [s.value for s in SlotState]


class ModelSlot:
    def __init__(
        self,
        config: ModelConfig,
        tasks: frozenset[Task],
        make_backend: Callable[[], Backend],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self._make_backend = make_backend
        self._metrics = metrics
        self._backend: Backend | None = None
        self._load: asyncio.Task[Backend] | None = None
        self._concurrency = asyncio.Semaphore(config.max_concurrency)
        self.state = SlotState.UNLOADED
        self.error: str | None = None
        self.failed_at: float | None = None
        self.load_seconds: float | None = None
        self.created = int(time.time())
        self._set_state(SlotState.UNLOADED)

    @property
    def id(self) -> str:
        return self.config.id

    async def ensure_ready(self, wait_s: float | None) -> Backend:
        """The started backend; starts it if nobody has. Waits at most `wait_s` (None: forever)."""
        if self._backend is not None and self.state is SlotState.READY:
            return self._backend
        if self.state is SlotState.FAILED:
            raise ModelLoadFailed(f"model '{self.id}' failed to load: {self.error}")
        if self._load is None:
            self._set_state(SlotState.LOADING)  # at once, so nobody sees "unloaded" meanwhile
            self._load = asyncio.create_task(self._start_backend(), name=f"load-{self.id}")
        try:
            return await asyncio.wait_for(asyncio.shield(self._load), timeout=wait_s)
        except TimeoutError:
            raise ModelNotReady(f"model '{self.id}' is still loading; retry shortly") from None

    async def acquire(self, wait_s: float | None) -> tuple[Backend, Callable[[], None]]:
        """A ready backend plus a turn to use it; call the returned function to give the turn back."""
        backend = await self.ensure_ready(wait_s)
        await self._concurrency.acquire()
        return backend, self._concurrency.release

    async def unload(self) -> None:
        if self._load is not None:
            await asyncio.gather(self._load, return_exceptions=True)
        backend, self._backend = self._backend, None
        if backend is None:
            return
        self._set_state(SlotState.UNLOADING)
        await backend.stop()
        self._set_state(SlotState.UNLOADED)

    async def _start_backend(self) -> Backend:
        started = time.monotonic()
        backend: Backend | None = None
        try:
            backend = self._make_backend()
            await backend.start()
        except BaseException as exc:
            await self._fail(backend, exc)
            raise self._as_load_error(exc) from exc
        finally:
            self._load = None
        self.load_seconds = time.monotonic() - started
        self._metrics.load_seconds.labels(model=self.id).observe(self.load_seconds)
        self._backend = backend
        self._set_state(SlotState.READY)
        log.info("model ready", extra={"model": self.id, "load_seconds": round(self.load_seconds, 3)})
        return backend

    async def _fail(self, backend: Backend | None, exc: BaseException) -> None:
        self.error = str(exc) or type(exc).__name__
        self.failed_at = time.time()
        self._set_state(SlotState.FAILED)
        log.error("model failed to load", extra={"model": self.id, "error": self.error})
        if backend is not None:
            try:
                await backend.stop()
            except Exception:
                log.exception("stopping a backend after a failed start also failed")

    def _as_load_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, ModelpoolError):
            return exc
        if isinstance(exc, Exception):
            return ModelLoadFailed(f"model '{self.id}' failed to load: {self.error}")
        return exc  # cancellation and friends pass through untouched

    def _set_state(self, state: SlotState) -> None:
        self.state = state
        self._metrics.set_model_state(self.id, state.value, _ALL_STATES)
