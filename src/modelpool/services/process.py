"""A managed process: spawned in its own process group, polled until healthy, its output
kept in a ring buffer (and a log file), stopped with SIGTERM then SIGKILL, and watched so
that a crash is noticed with its exit code and last lines.

A persistent process writes straight into its log file instead of a pipe to us, so that it
outlives modelpool; a later modelpool adopts it by pid (`ManagedProcess.adopt`) and then
watches it by polling, since it is no longer our child. Such a process is spawned with
plain `subprocess.Popen`, not asyncio's: closing an asyncio subprocess transport (which
happens when it is garbage-collected) kills a child that is still running.

An engine gets an allowlisted environment (`config.environment.engine_environment`), not
modelpool's own, where the variables its API keys are read from live. One that dies with
modelpool is started through a small exec wrapper that asks the kernel for SIGTERM when
modelpool dies (Linux's parent-death signal), then becomes the engine (same pid). The
wrapper, not a `preexec_fn`: code between fork and exec in a process with threads (engine
threads, executors) can deadlock on a lock another thread held at the fork, and a
`preexec_fn` also makes every spawn a full fork of a process that may hold gigabytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from modelpool.config.environment import child_environment, engine_environment
from modelpool.errors import ModelLoadFailed
from modelpool.services.pids import is_alive, wait_gone

log = logging.getLogger("modelpool.services")
POLL_S = 0.2


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
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Added to (and overriding) what the process gets of modelpool's environment."""
    inherit_env: bool = False
    """Hand on modelpool's whole environment (a stack's services, which the operator wrote:
    a modelpool among them reads its keys from it). Otherwise (engines) only the allowlist
    of `engine_environment` and the variables named in `pass_env`."""
    pass_env: tuple[str, ...] = ()
    """Further variables of modelpool's environment the process gets by name."""
    api_key: str | None = field(default=None, repr=False)
    """A key the process demands of its callers: given to it in `api_key_env` (never on its
    command line, which every local user can read) and sent on health polls."""
    api_key_env: str | None = None
    library_path: tuple[str, ...] = ()
    """Prepended to LD_LIBRARY_PATH."""
    start_timeout_s: float = 120.0
    stop_grace_s: float = 20.0
    log_file: Path | None = None
    log_lines: int = 500
    new_session: bool = True
    """Its own session and process group: a signal to the group reaches its children too,
    and a signal to modelpool's group (Ctrl-C) does not reach it."""
    output_to_file: bool = False
    """Write output straight into `log_file` (needed by processes that outlive modelpool)."""
    cwd: Path | None = None
    die_with_parent: bool = False
    """Linux: the kernel sends the process SIGTERM when the process that started it dies,
    even by SIGKILL or the OOM killer (a foreground `modelpool up` that is killed takes its
    services along; a modelpool its engines). The signal comes when the *thread* that spawned
    the process ends: spawn from the event loop's thread, which lives as long as modelpool."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv_with_port(self) -> list[str]:
        return [arg.replace("{port}", str(self.port)) for arg in self.argv]

    def command(self) -> list[str]:
        """What is executed: the argv, behind the parent-death wrapper when it must die with us."""
        if self.die_with_parent and sys.platform == "linux":
            return dies_with_us(self.argv_with_port)
        return self.argv_with_port

    def environment(self) -> dict[str, str]:
        env = child_environment(self.env) if self.inherit_env else engine_environment(self.env, self.pass_env)
        if self.api_key_env is not None and self.api_key is not None:
            env[self.api_key_env] = self.api_key
        if self.library_path:
            existing = env.get("LD_LIBRARY_PATH")
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*self.library_path, *([existing] if existing else [])])
        return env


_PARENT_DEATH = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG; kept across exec
if os.getppid() != int(sys.argv[1]):  # modelpool died before the line above: nobody to die with
    sys.exit(f"{sys.argv[2]} not started: the modelpool that spawned it (pid {sys.argv[1]}) is gone")
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    sys.exit(f"cannot run {sys.argv[2]}: {error.strerror}")
"""
"""Run by `python -I -S -c` with modelpool's pid and the argv: ask for SIGTERM when modelpool
dies, then become the process (exec keeps the pid, so modelpool watches the real one)."""


def dies_with_us(argv: list[str]) -> list[str]:
    """`argv` behind the parent-death wrapper: it gets SIGTERM when modelpool dies (Linux)."""
    return [sys.executable, "-I", "-S", "-c", _PARENT_DEATH, str(os.getpid()), *argv]


class ManagedProcess:
    def __init__(self, spec: ProcessSpec, on_exit: Callable[[int | None], None] | None = None) -> None:
        if spec.output_to_file and spec.log_file is None:
            raise ValueError("output_to_file needs a log_file")
        self.spec = spec
        self.lines: deque[str] = deque(maxlen=spec.log_lines)
        self._on_exit = on_exit
        self._process: asyncio.subprocess.Process | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        """A child that writes into its log file (see the module docstring)."""
        self._adopted_pid: int | None = None
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        if self._process is not None:
            return self._process.pid
        return self._popen.pid if self._popen is not None else self._adopted_pid

    @property
    def returncode(self) -> int | None:
        """The exit code of a child that ended (None while it runs, and for adopted processes)."""
        if self._process is not None:
            return self._process.returncode
        return self._popen.poll() if self._popen is not None else None

    @property
    def running(self) -> bool:
        if self._process is not None or self._popen is not None:
            return self.returncode is None
        return self._adopted_pid is not None and is_alive(self._adopted_pid)

    async def start(self, on_spawned: Callable[[int], None] | None = None) -> None:
        """Spawn and wait until the health URL answers 200; ProcessFailed otherwise.
        `on_spawned(pid)` runs before the wait (to record the process while it starts)."""
        spec = self.spec
        if spec.log_file is not None:
            spec.log_file.parent.mkdir(parents=True, exist_ok=True)
        if spec.output_to_file:
            self._popen = self._spawn_into_log_file()
        else:
            self._process = await asyncio.create_subprocess_exec(
                *spec.command(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=spec.environment(),
                start_new_session=spec.new_session,
                cwd=spec.cwd,
            )
            self._pump = asyncio.create_task(self._pump_output(), name=f"output-{spec.name}")
        self.started_at = time.time()
        log.info("process started", extra={"service": spec.name, "pid": self.pid, "port": spec.port})
        try:
            if on_spawned is not None:
                assert self.pid is not None
                on_spawned(self.pid)
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise
        self._watch = asyncio.create_task(self._watch_exit(), name=f"watch-{spec.name}")

    def _spawn_into_log_file(self) -> subprocess.Popen[bytes]:
        assert self.spec.log_file is not None
        with self.spec.log_file.open("ab") as sink:  # the child holds its own descriptor
            return subprocess.Popen(
                self.spec.command(),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.spec.environment(),
                start_new_session=self.spec.new_session,
                cwd=self.spec.cwd,
            )

    def adopt(self, pid: int, started_at: float | None = None) -> None:
        """Take over a running process that an earlier modelpool started (not our child)."""
        self._adopted_pid = pid
        self.started_at = started_at
        self._watch = asyncio.create_task(self._watch_exit(), name=f"watch-{self.spec.name}")
        log.info("process adopted", extra={"service": self.spec.name, "pid": pid, "port": self.spec.port})

    async def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after the grace period. Returns the exit
        code (None for an adopted process: only its parent learns it)."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        if self._process is not None:
            await self._stop_child(self._process)
        elif self._popen is not None or self._adopted_pid is not None:
            pid = self.pid
            assert pid is not None
            await terminate_group(pid, self.spec.stop_grace_s, name=self.spec.name)
            if self._popen is not None:
                self._popen.wait()  # reap it (terminate_group saw it become a zombie)
        if self._pump is not None:
            await asyncio.gather(self._pump, return_exceptions=True)
        return self.returncode

    async def detach(self) -> None:
        """Stop watching and leave the process running (a persistent process at shutdown)."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        if self._pump is not None:  # a piped child would die of SIGPIPE later: do not leave one behind
            await self.stop()

    async def check_health(self) -> bool:
        return await answers_health(self.spec.base_url + self.spec.health_path, self.spec.api_key)

    def last_lines(self, count: int = 20) -> str:
        return "\n".join(self.tail(count))

    def tail(self, count: int) -> list[str]:
        """The last `count` lines of output (from the log file when the process writes there)."""
        if self._pump is None and self.spec.log_file is not None and self.spec.log_file.exists():
            return file_tail(self.spec.log_file, count)
        return list(self.lines)[-count:] if count > 0 else []

    # ----- internals -----------------------------------------------------------------

    async def _stop_child(self, process: asyncio.subprocess.Process) -> None:
        if process.returncode is not None:
            return
        self._signal(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.spec.stop_grace_s)
        except asyncio.TimeoutError:
            log.warning("process ignored SIGTERM; killing it", extra={"service": self.spec.name})
            self._signal(process.pid, signal.SIGKILL)
            await process.wait()

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
            await asyncio.sleep(POLL_S)
        raise ProcessFailed(
            f"{self.spec.name} was not healthy at {self.spec.base_url}{self.spec.health_path} after "
            f"{self.spec.start_timeout_s:.0f}s:\n{self.last_lines()}"
        )

    async def _pump_output(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        await relay_output(self._process.stdout, self.lines, self.spec.log_file)

    async def _watch_exit(self) -> None:
        if self._process is not None:
            code: int | None = await self._process.wait()
            if self._pump is not None:
                await asyncio.gather(self._pump, return_exceptions=True)  # the last lines are in
        elif self._popen is not None:
            while self._popen.poll() is None:
                await asyncio.sleep(POLL_S * 5)
            code = self._popen.returncode
        else:
            assert self._adopted_pid is not None
            while is_alive(self._adopted_pid):
                await asyncio.sleep(POLL_S * 5)
            code = None
        if not self._stopping:
            log.error("process exited", extra={"service": self.spec.name, "code": code})
            if self._on_exit is not None:
                self._on_exit(code)

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it is gone already
            if self.spec.new_session:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


async def answers_health(url: str, api_key: str | None = None) -> bool:
    """One probe: 200 within 2 s (with the process's key, when it demands one)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=2.0, headers=headers) as client:
            return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


async def terminate_group(pid: int, grace_s: float, *, name: str = "") -> str:
    """SIGTERM to the process group led by `pid` (or to `pid`), SIGKILL after `grace_s`. Returns what it
    took: "gone" (not running), "terminated" or "killed"."""
    if not is_alive(pid):
        return "gone"
    _signal_group(pid, signal.SIGTERM)
    if await wait_gone(pid, grace_s):
        return "terminated"
    log.warning("process ignored SIGTERM; killing it", extra={"service": name, "pid": pid})
    _signal_group(pid, signal.SIGKILL)
    await wait_gone(pid, 10.0)
    return "killed"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """The process group `pid` leads (its workers too); the process alone if it leads none."""
    with contextlib.suppress(ProcessLookupError):  # it is gone already
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


async def relay_output(source: asyncio.StreamReader, lines: deque[str], log_file: Path | None) -> None:
    """Every line of `source` into the ring buffer `lines` and, flushed at once, the log file
    (what a crash message and `GET /v1/admin/models/{id}/logs` show), until the stream ends."""
    sink = log_file.open("a", encoding="utf-8") if log_file else None
    try:
        async for raw in source:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            lines.append(line)
            if sink is not None:
                sink.write(line + "\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()


def file_tail(path: Path, count: int, block: int = 64 * 1024) -> list[str]:
    """The last `count` lines of a file, reading only its end."""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - block * max(1, count // 200 + 1)))
        data = handle.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-count:] if count > 0 else []
