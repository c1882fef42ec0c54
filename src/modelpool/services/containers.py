"""An engine run as a container (Docker or Podman): the same surface as `ManagedProcess`
(start, stop, detach, adopt, health, output), driven through the runtime's CLI.

The container is started with an attached `run --rm` (see `container_argv.run_argv`): the
client relays the engine's output to its last line (into the ring buffer and the log file)
and exits with the container's code, which is how its end is noticed. `--sig-proxy=false`:
ending the client (detach) leaves the container running. A persistent container adopted by
a later modelpool is followed with `logs -f` and `wait` instead. Every client dies with
modelpool (the parent-death wrapper); the container does not (the runtime is its parent):
a persistent one is adopted next time, any other is stopped by the reaper. `pid` is the
container's init process as the host sees it (from `inspect`): memory is measured there, and
records name it with its creation time, so a record outlives neither the container nor a
reused pid."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable

from modelpool.config.environment import secret
from modelpool.errors import ModelLoadFailed
from modelpool.services.container_argv import (
    LABEL_MODEL,
    ContainerSpec,
    client_environment,
    login_argv,
    logs_argv,
    run_argv,
    tool_environment,
    wait_argv,
)
from modelpool.services.container_cli import CLI_TIMEOUT_S, call, inspect, stop_container, tail_of
from modelpool.services.pids import create_time
from modelpool.services.process import (
    POLL_S,
    ProcessFailed,
    answers_health,
    dies_with_us,
    file_tail,
    relay_output,
)

log = logging.getLogger("modelpool.services")


def _helper(argv: list[str]) -> list[str]:
    """A `run`, `logs -f` or `wait` client that must not outlive modelpool. They also run in
    a session of their own (a Ctrl-C to modelpool's process group must not end them: that
    would read as the engine's end)."""
    return dies_with_us(argv) if sys.platform == "linux" else argv


class ContainerProcess:
    def __init__(self, spec: ContainerSpec, on_exit: Callable[[int | None], None] | None = None) -> None:
        self.spec = spec
        self.lines: deque[str] = deque(maxlen=spec.log_lines)
        self._on_exit = on_exit
        self._pid: int | None = None
        self._adopted = False
        self._gone = False
        self._stopping = False
        self._helpers: list[asyncio.subprocess.Process] = []
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._following: asyncio.Task[None] | None = None
        self.exit_code: int | None = None
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        """The container's init process, as the host sees it."""
        return self._pid

    @property
    def running(self) -> bool:
        return self._pid is not None and not self._gone

    async def start(self, on_spawned: Callable[[int], None] | None = None) -> None:
        """Log in (when configured), run the container, wait until its health URL answers 200;
        ProcessFailed otherwise (the container stopped). `on_spawned(pid)` runs before the wait."""
        spec = self.spec
        await self._login()
        await self._clear_name()
        if spec.log_file is not None:
            spec.log_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            client = await asyncio.create_subprocess_exec(
                *_helper(run_argv(spec)),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                env=client_environment(spec), start_new_session=True,
            )  # fmt: skip
        except OSError as error:
            raise ModelLoadFailed(f"cannot run the container runtime {spec.runtime.path}: {error.strerror}") from error
        self._helpers = [client]
        self._pump = asyncio.create_task(self._pump_output(client), name=f"output-{spec.name}")
        self._watch = asyncio.create_task(self._watch_exit(client, code_printed=False), name=f"watch-{spec.name}")
        try:
            self._pid = await self._container_pid()
            self.started_at = create_time(self._pid) or time.time()
            log.info("container started", extra={"service": spec.name, "container": spec.container,
                                                 "pid": self._pid, "port": spec.port})  # fmt: skip
            if on_spawned is not None:
                on_spawned(self._pid)
            await self._wait_healthy()
        except BaseException:
            await self.stop()
            raise

    def adopt(self, pid: int, started_at: float | None = None) -> None:
        """Take over a running container an earlier modelpool started: follow its new output
        and watch for its end."""
        self._pid, self.started_at, self._adopted = pid, started_at, True
        self._following = asyncio.create_task(self._follow(), name=f"follow-{self.spec.name}")
        log.info("container adopted", extra={"service": self.spec.name, "container": self.spec.container,
                                             "pid": pid, "port": self.spec.port})  # fmt: skip

    async def stop(self) -> int | None:
        """Stop the container (SIGTERM, SIGKILL after the grace period) and the helpers."""
        self._stopping = True
        if not self._gone:
            await stop_container(self.spec.runtime, self.spec.container, self.spec.stop_grace_s, name=self.spec.name)
        self._gone = True
        await self._end_helpers(wait_s=5.0)
        return self.exit_code

    async def detach(self) -> None:
        """Leave the container running; stop following it (a persistent one at shutdown)."""
        self._stopping = True
        await self._end_helpers(wait_s=0.0)

    async def check_health(self) -> bool:
        return await answers_health(self.spec.base_url + self.spec.health_path, self.spec.api_key)

    def last_lines(self, count: int = 20) -> str:
        return "\n".join(self.tail(count))

    def tail(self, count: int) -> list[str]:
        """The last `count` lines of output (from the log file for an adopted container,
        whose earlier output went there)."""
        if self._adopted and self.spec.log_file is not None and self.spec.log_file.exists():
            return file_tail(self.spec.log_file, count)
        return list(self.lines)[-count:] if count > 0 else []

    # ----- internals -----------------------------------------------------------------

    async def _login(self) -> None:
        login = self.spec.login
        if login is None:
            return
        password = secret(login.password_env)
        if password is None:
            log.info("registry login skipped: its variable is not set",
                     extra={"service": self.spec.name, "variable": login.password_env})  # fmt: skip
            return
        done = await call(login_argv(self.spec.runtime, login), tool_environment(), stdin=password.encode())
        if done.code != 0:
            message = tail_of(done.err).replace(password, "***")
            raise ModelLoadFailed(
                f"{self.spec.name}: `{self.spec.runtime.kind} login {login.registry}` as {login.username} failed "
                f"(password from ${login.password_env}):\n{message}"
            )

    async def _clear_name(self) -> None:
        """A running container by our name that we did not adopt is an error; a stopped
        one of this model's is removed (a leftover the runtime kept)."""
        spec = self.spec
        state = await inspect(spec.runtime, spec.container)
        if state is None:
            return
        if state.running or state.labels.get(LABEL_MODEL) != spec.name:
            raise ModelLoadFailed(
                f"model '{spec.name}': a container named '{spec.container}' already exists"
                f"{' and is running' if state.running else ''} (stop it, or set another `container.name`)"
            )
        await call(spec.client("rm", "-f", spec.container), tool_environment())
        deadline = time.monotonic() + CLI_TIMEOUT_S / 4
        while await inspect(spec.runtime, spec.container) is not None:  # a removal under way elsewhere ends
            if time.monotonic() > deadline:
                raise ModelLoadFailed(f"model '{spec.name}': the stopped container '{spec.container}' stays")
            await asyncio.sleep(POLL_S)

    async def _follow(self) -> None:
        """An adopted container: `logs -f` of its new output (into the ring buffer and log
        file) and `wait` for its end."""
        env = tool_environment()
        runtime, container = self.spec.runtime, self.spec.container
        logs = await asyncio.create_subprocess_exec(
            *_helper(logs_argv(runtime, container, since_now=True)),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
        waiter = await asyncio.create_subprocess_exec(
            *_helper(wait_argv(runtime, container)),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
        self._helpers = [logs, waiter]
        self._pump = asyncio.create_task(self._pump_output(logs), name=f"output-{self.spec.name}")
        self._watch = asyncio.create_task(self._watch_exit(waiter, code_printed=True), name=f"watch-{self.spec.name}")

    async def _container_pid(self) -> int:
        """The container's init pid once it runs (the client may pull the image first)."""
        deadline = time.monotonic() + self.spec.start_timeout_s
        while time.monotonic() < deadline:
            if self._gone:
                raise self._failed_while_starting()
            state = await inspect(self.spec.runtime, self.spec.container)
            if state is not None and state.running and state.pid > 0:
                return state.pid
            await asyncio.sleep(POLL_S * 2)
        raise ProcessFailed(f"{self.spec.name}: its container did not start within {self.spec.start_timeout_s:.0f}s:\n"
                            f"{self.last_lines()}")  # fmt: skip

    def _failed_while_starting(self) -> ProcessFailed:
        return ProcessFailed(f"{self.spec.name}: its container exited with code {self.exit_code} while starting:\n"
                             f"{self.last_lines()}")  # fmt: skip

    async def _pump_output(self, source: asyncio.subprocess.Process) -> None:
        assert source.stdout is not None
        await relay_output(source.stdout, self.lines, self.spec.log_file)

    async def _watch_exit(self, helper: asyncio.subprocess.Process, *, code_printed: bool) -> None:
        """The end of the attached `run` client (its code is the container's) or of `wait`
        (which prints the code; none when the container was removed first)."""
        if code_printed:
            assert helper.stdout is not None
            out = await helper.stdout.read()
            await helper.wait()
            with contextlib.suppress(ValueError, IndexError):
                self.exit_code = int(out.decode().strip().splitlines()[-1])
        else:
            self.exit_code = await helper.wait()
        self._gone = True
        if self._pump is not None:
            with contextlib.suppress(asyncio.TimeoutError):  # the last lines are in
                await asyncio.wait_for(asyncio.shield(self._pump), 5.0)
        if self._stopping:
            return
        log.error("container exited", extra={"service": self.spec.name, "code": self.exit_code})
        if self._on_exit is not None:
            self._on_exit(self.exit_code)

    async def _wait_healthy(self) -> None:
        spec = self.spec
        deadline = time.monotonic() + spec.start_timeout_s
        while time.monotonic() < deadline:
            if self._gone:
                raise self._failed_while_starting()
            if await self.check_health():
                return
            await asyncio.sleep(POLL_S)
        raise ProcessFailed(
            f"{spec.name}: its container was not healthy at {spec.base_url}{spec.health_path} after "
            f"{spec.start_timeout_s:.0f}s:\n{self.last_lines()}"
        )

    async def _end_helpers(self, wait_s: float) -> None:
        if self._following is not None:
            await asyncio.gather(self._following, return_exceptions=True)  # its helpers are listed now
        if self._watch is not None:
            self._watch.cancel()
        if wait_s and self._pump is not None:  # `logs -f` ends with the container: its last lines
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), wait_s)
        for helper in self._helpers:
            if helper.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    helper.terminate()
            await helper.wait()
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        self._helpers = []
