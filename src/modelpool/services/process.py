"""A managed process: spawned in its own process group, polled until healthy, its output
kept in a ring buffer (and a log file), stopped with SIGTERM then SIGKILL, and watched so
that a crash is noticed with its exit code and last lines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from modelpool.errors import ModelLoadFailed

log = logging.getLogger("modelpool.services")


class ProcessFailed(ModelLoadFailed):
    """The process exited, or never became healthy; the message has its last lines."""


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    """`{port}` anywhere in an argument is replaced by the process's port."""
    port: int
    host: str = "127.0.0.1"
    health_path: str = "/health"
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to (and overriding) modelpool's own environment."""
    library_path: tuple[str, ...] = ()
    """Prepended to LD_LIBRARY_PATH."""
    start_timeout_s: float = 120.0
    stop_grace_s: float = 20.0
    log_file: Path | None = None
    log_lines: int = 500
    new_session: bool = True
    """Its own session and process group: a signal to the group reaches its children too."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ManagedProcess:
    def __init__(self, spec: ProcessSpec, on_exit: Callable[[int], None] | None = None) -> None:
        self.spec = spec
        self.lines: deque[str] = deque(maxlen=spec.log_lines)
        self._on_exit = on_exit
        self._process: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        """Spawn and wait until the health URL answers 200; ProcessFailed otherwise."""
        spec = self.spec
        argv = [arg.replace("{port}", str(spec.port)) for arg in spec.argv]
        self._process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._environment(),
            start_new_session=spec.new_session,
        )
        self.started_at = time.time()
        log.info("process started", extra={"service": spec.name, "pid": self._process.pid, "port": spec.port})
        self._pump = asyncio.create_task(self._pump_output(), name=f"output-{spec.name}")
        try:
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        self._watch = asyncio.create_task(self._watch_exit(), name=f"watch-{spec.name}")

    async def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after the grace period. Returns the exit code."""
        process = self._process
        if process is None:
            return None
        self._stopping = True
        if process.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.spec.stop_grace_s)
            except TimeoutError:
                log.warning("process ignored SIGTERM; killing it", extra={"service": self.spec.name})
                self._signal(signal.SIGKILL)
                await process.wait()
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)
        if self._watch is not None:
            self._watch.cancel()
        return process.returncode

    async def check_health(self) -> bool:
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                response = await client.get(self.spec.base_url + self.spec.health_path)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def last_lines(self, count: int = 20) -> str:
        return "\n".join(list(self.lines)[-count:])

    # ----- internals -----------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.spec.env}
        if self.spec.library_path:
            existing = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*self.spec.library_path, *([existing] if existing else [])])
        return env

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.start_timeout_s
        while time.monotonic() < deadline:
            if self.returncode is not None:
                await asyncio.gather(*(t for t in [self._pump] if t), return_exceptions=True)
                raise ProcessFailed(
                    f"{self.spec.name} exited with code {self.returncode} while starting:\n{self.last_lines()}"
                )
            if await self.check_health():
                return
            await asyncio.sleep(0.2)
        raise ProcessFailed(
            f"{self.spec.name} was not healthy at {self.spec.base_url}{self.spec.health_path} after "
            f"{self.spec.start_timeout_s:.0f}s:\n{self.last_lines()}"
        )

    async def _pump_output(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        sink = self.spec.log_file.open("a", encoding="utf-8") if self.spec.log_file else None
        try:
            async for raw in self._process.stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                self.lines.append(line)
                if sink is not None:
                    sink.write(line + "\n")
                    sink.flush()
        finally:
            if sink is not None:
                sink.close()

    async def _watch_exit(self) -> None:
        assert self._process is not None
        code = await self._process.wait()
        if not self._stopping:
            log.error("process exited", extra={"service": self.spec.name, "code": code})
            if self._on_exit is not None:
                self._on_exit(code)

    def _signal(self, sig: signal.Signals) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError):  # it is gone already
            if self.spec.new_session:
                os.killpg(self._process.pid, sig)
            else:
                self._process.send_signal(sig)
