"""`up` for a stack: start its services in dependency order (independent ones at the same
time), wait for each to be healthy, reuse the ones already running, and record each in
the registry the moment it is spawned, so that `status`, `down` and port allocation by
another launcher see it while it starts."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from modelpool.errors import ConfigError
from modelpool.services.pids import create_time, is_alive
from modelpool.services.ports import port_is_free
from modelpool.services.process import ManagedProcess, ProcessFailed, ProcessSpec, answers_health
from modelpool.services.registry import STATE_DIR_ENV, Registry, ServiceRecord
from modelpool.services.stack import Service, Stack

EventSink = Callable[[str, str], None]
"""(service name, what happened): progress for the terminal."""

STARTED, REUSED, FAILED, SKIPPED = "started", "reused", "failed", "skipped"
CLEAN_EXITS = (0, -signal.SIGTERM)


class PortBusy(ConfigError):
    """An explicit port that something else listens on."""


@dataclass
class Outcome:
    service: Service
    state: str
    record: ServiceRecord | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass
class Launcher:
    stack: Stack
    registry: Registry
    detach: bool = False
    """False: non-persistent services die with this process (a foreground `up`)."""
    on_event: EventSink = lambda name, message: None
    extra_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Given to every service under its own `env` (saved credentials, the stack's `.env`);
    the caller leaves out what the process environment already sets."""
    progress_every_s: float = 10.0
    """How often a service that is still starting is reported."""
    started: dict[str, ManagedProcess] = field(default_factory=dict)
    """What this launcher spawned (not what it reused), by service name."""
    crashed: list[str] = field(default_factory=list)
    """Services it started that later exited other than cleanly."""
    _ports_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _ports_claimed: set[int] = field(default_factory=set)

    async def up(self, names: list[str] | None = None) -> list[Outcome]:
        """Start (or reuse) the services, dependencies first; one Outcome each, in stack order."""
        services = self.stack.closure(names) if names else list(self.stack.services.values())
        tasks: dict[str, asyncio.Task[Outcome]] = {}
        for service in services:  # dependency order: a task's dependencies already have tasks
            dependencies = [tasks[d] for d in service.spec.depends_on]
            tasks[service.name] = asyncio.create_task(self._bring_up(service, dependencies))
        return list(await asyncio.gather(*tasks.values()))

    async def stop_started(self, *, include_persistent: bool = False) -> list[str]:
        """Stop what this launcher spawned, dependents first; returns their names."""
        stopped = []
        for name in reversed(list(self.started)):
            if self.stack.services[name].spec.persistent and not include_persistent:
                continue
            process = self.started.pop(name)
            self.on_event(name, "stopping")
            await process.stop()
            self.registry.remove(record_id(self.stack, name, process.spec.port))
            stopped.append(name)
        return stopped

    async def detach_all(self) -> None:
        for process in self.started.values():
            await process.detach()

    # ----- one service ----------------------------------------------------------------

    async def _bring_up(self, service: Service, dependencies: list[asyncio.Task[Outcome]]) -> Outcome:
        for outcome in await asyncio.gather(*dependencies):
            if outcome.state in (FAILED, SKIPPED):
                self.on_event(service.name, f"skipped: {outcome.service.name} is not up")
                return Outcome(service, SKIPPED, error=f"{outcome.service.name} is not up")
        began = time.monotonic()
        try:
            reused = await self._reuse(service)
            if reused is not None:
                self.on_event(service.name, f"already running (pid {reused.pid}, {reused.url}): reused")
                if reused.extra.get("fingerprint") != service.fingerprint():
                    self.on_event(
                        service.name,
                        f"its definition or config file changed since it started; to apply: "
                        f"`modelpool down {reused.id}`, then `up` again",
                    )
                return Outcome(service, REUSED, reused, seconds=time.monotonic() - began)
            record = await self._start(service, self._peers(service.spec.depends_on))
        except (ConfigError, ProcessFailed) as exc:
            self.on_event(service.name, f"failed: {exc.message}")
            return Outcome(service, FAILED, error=exc.message, seconds=time.monotonic() - began)
        seconds = time.monotonic() - began
        self.on_event(service.name, f"ready at {record.url} in {seconds:.1f}s")
        return Outcome(service, STARTED, record, seconds=seconds)

    async def _reuse(self, service: Service) -> ServiceRecord | None:
        """The running instance of this service, once it is healthy; None if there is none
        (or it died while we waited for it)."""
        record = self.running_record(service)
        if record is None:
            return None
        health_url = record.url + record.health_path
        if await answers_health(health_url):
            return record
        self.on_event(service.name, f"running (pid {record.pid}) but not healthy yet: waiting")
        deadline = time.monotonic() + service.start_timeout_s
        while time.monotonic() < deadline:
            if not is_alive(record.pid, record.started_at):
                return None
            if await answers_health(health_url):
                return record
            await asyncio.sleep(0.5)
        raise ConfigError(
            f"already running (pid {record.pid}) but not healthy at {health_url} after "
            f"{service.start_timeout_s:.0f}s; see `modelpool logs {record.id}`, or stop it with "
            f"`modelpool down {record.id}`"
        )

    def running_record(self, service: Service) -> ServiceRecord | None:
        for record in self.registry.find(name=service.name):
            if record.extra.get("stack_file") == str(self.stack.file):
                return record
        return None

    async def _start(self, service: Service, peers: dict[str, tuple[str, int]]) -> ServiceRecord:
        host = service.spec.host
        async with self._ports_lock:
            port = self._allocate_port(service)
            self._ports_claimed.add(port)
        env = {**self.extra_env, STATE_DIR_ENV: str(self.registry.state_dir), **service.environment(host, port, peers)}
        spec = ProcessSpec(
            name=f"{self.stack.name}/{service.name}",
            argv=tuple(service.argv(host, port, peers)),
            port=port,
            host=host,
            health_path=service.health_path,
            env=env,
            inherit_env=True,  # the operator's own commands, and modelpools that read their keys from it
            start_timeout_s=service.start_timeout_s,
            stop_grace_s=service.spec.stop_grace_s,
            log_file=self.log_file(service),
            output_to_file=True,
            die_with_parent=not (self.detach or service.spec.persistent),
            cwd=service.cwd,
        )
        process = ManagedProcess(spec, on_exit=lambda code: self._exited(service, code))
        records: list[ServiceRecord] = []

        def spawned(pid: int) -> None:
            self.on_event(service.name, f"starting on {spec.base_url} (pid {pid}), log {spec.log_file}")
            records.append(self._record(service, spec, pid))
            self.registry.put(records[0])

        ticker = asyncio.create_task(self._tick(service.name, f"waiting for {spec.base_url}{spec.health_path}"))
        try:
            await process.start(on_spawned=spawned)
        except BaseException:
            if records:
                self.registry.remove(records[0].id)
            raise
        finally:
            ticker.cancel()
        self.started[service.name] = process
        return records[0]

    async def _tick(self, name: str, what: str) -> None:
        """A line now and then while a slow service (loading models, say) starts."""
        began = time.monotonic()
        while True:
            await asyncio.sleep(self.progress_every_s)
            self.on_event(name, f"{what} ({time.monotonic() - began:.0f}s)")

    def _allocate_port(self, service: Service) -> int:
        registered = {r.port: r for r in self.registry.records()}
        host = service.spec.host
        if isinstance(service.spec.port, int):
            port = service.spec.port
            if port in registered:
                other = registered[port]
                raise PortBusy(f"port {port} is taken by service {other.id} (pid {other.pid}, {other.url})")
            if port in self._ports_claimed or not port_is_free(port, host):
                raise PortBusy(
                    f"port {port} on {host} is busy: another program listens there; free it or use port: auto"
                )
            return port
        for port in range(self.stack.port_base, 65536):
            if port not in registered and port not in self._ports_claimed and port_is_free(port, host):
                return port
        raise PortBusy(f"no free port on {host} from {self.stack.port_base} up")

    def log_file(self, service: Service) -> Path:
        return self.registry.state_dir / "logs" / self.stack.name / f"{service.name}.log"

    def _record(self, service: Service, spec: ProcessSpec, pid: int) -> ServiceRecord:
        return ServiceRecord(
            id=record_id(self.stack, service.name, spec.port),
            name=service.name,
            kind=service.kind,
            pid=pid,
            port=spec.port,
            url=spec.base_url,
            started_at=create_time(pid) or time.time(),
            stack=self.stack.name,
            log_file=str(spec.log_file),
            health_path=spec.health_path,
            extra={
                "stack_file": str(self.stack.file),
                "depends_on": list(service.spec.depends_on),
                "persistent": service.spec.persistent,
                "stop_grace_s": service.spec.stop_grace_s,
                "fingerprint": service.fingerprint(),
                "launcher_pid": None if self.detach else os.getpid(),
            },
        )

    def _peers(self, names: list[str]) -> dict[str, tuple[str, int]]:
        peers = {}
        for name in names:
            record = self.running_record(self.stack.services[name])
            if record is not None:
                peers[name] = (record.url, record.port)
        return peers

    def _exited(self, service: Service, code: int | None) -> None:
        """A service this launcher started ended by itself, or was stopped from outside
        (`modelpool down`: SIGTERM, exit 0 or -15); anything else is a crash."""
        process = self.started.pop(service.name, None)
        if process is not None:
            self.registry.remove(record_id(self.stack, service.name, process.spec.port))
        if code in CLEAN_EXITS:
            self.on_event(service.name, f"stopped (exit code {code})")
            return
        self.crashed.append(service.name)
        last = process.last_lines(5) if process is not None else ""
        self.on_event(service.name, f"exited unexpectedly (code {code})" + (f":\n{last}" if last else ""))


def record_id(stack: Stack, name: str, port: int) -> str:
    return f"{stack.name}/{name}@{port}"
