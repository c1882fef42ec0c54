"""ManagedServerBackend: a model served by an engine process that modelpool starts, watches
and stops (llama-server, `vllm serve`), reached over loopback HTTP like any upstream.

One backend instance is one process on one port, so N replicas are N processes. A
`persistent` process is started in its own session, writes its output to a log file and is
recorded in the state registry, so it survives a modelpool restart; the next modelpool
adopts it (after a health probe) instead of starting a second one. Any other process dies
with modelpool, and is recorded with its owner while it runs, so that a modelpool that
starts after one that died stops what it left (`services.reaper`).

An engine that can demand an API key (llama-server, llama_cpp.server, vLLM) is started with
a random one, which modelpool sends on every call: another local user cannot go around
modelpool's keys and limits through the engine's port. It gets an allowlisted environment,
never the variables modelpool's own keys are read from.

With `options.container` the same argv runs inside a container image (`containerized`,
`services.containers`): the same records, adoption, keys, logs and supervision.
"""

from __future__ import annotations

import logging
import secrets
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from modelpool.backends.base import DeclaredBackend, MemoryEstimate
from modelpool.backends.context import BackendContext
from modelpool.backends.managed.container_options import ContainerOptions
from modelpool.backends.managed.containerized import adopted_spec, container_spec
from modelpool.backends.remote.client import ENGINE_KEEPALIVE_S, RetryPolicy, UpstreamClient, UpstreamTimeouts
from modelpool.backends.remote.forwarding import ForwardingBackend
from modelpool.capabilities import Capabilities, Locality
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import files_size, locate
from modelpool.errors import ModelLoadFailed, UpstreamUnavailable
from modelpool.services.container_argv import ContainerSpec, Runtime
from modelpool.services.container_cli import container_record, find_runtime, inspect, labelled, recorded_runtime
from modelpool.services.containers import ContainerProcess
from modelpool.services.pids import create_time, tree_rss
from modelpool.services.ports import free_port, port_in_use
from modelpool.services.process import ManagedProcess, ProcessSpec
from modelpool.services.reaper import owned_engines, owned_record
from modelpool.services.registry import ENGINE_KIND, Registry, ServiceRecord
from modelpool.tasks import Task

log = logging.getLogger("modelpool.services")
MANAGED_CAPABILITIES = Capabilities(
    tasks=frozenset({Task.CHAT, Task.COMPLETION, Task.EMBEDDING}),
    locality=Locality.ENGINE_PROCESS,
    tools=True,  # forwarded as they are: the engine renders, constrains and parses them
    structured_output=True,
    thinking_in_template=True,  # chat_template_kwargs forwarded; the engine's reasoning parser splits
)


class ManagedOptions(BaseModel):
    """How the engine process is run; every managed backend has these."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    port: int | None = Field(default=None, ge=1, le=65535)
    """Port to serve on (default: a free one; with replicas, each picks its own)."""
    host: str = "127.0.0.1"
    """Address the engine binds to and modelpool talks to."""
    health_path: str | None = None
    """Path that answers 200 once the engine is ready (default: the engine's own, e.g.
    `/health` for llama-server and vLLM, `/v1/models` for llama_cpp.server)."""
    persistent: bool = False
    """Keep the process running when modelpool stops, and adopt it on the next start
    (`modelpool stop-persistent` stops such processes)."""
    start_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for the process to answer its health check."""
    stop_grace_s: float = Field(default=20.0, ge=0)
    """Wait between SIGTERM and SIGKILL when stopping."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables set for the process. It gets no other of modelpool's own than
    locale, paths, caches, device selection and thread settings (`CUDA_*`, `OMP_*`, `HF_HOME`,
    ...), so this is where the rest goes."""
    pass_env: list[str] = Field(default_factory=list)
    """Names of further variables of modelpool's environment the process gets as they are
    (`HF_TOKEN` for a gated model, a proxy). Never name one an API key of modelpool's is in."""
    library_path: list[str] = Field(default_factory=list)
    """Directories prepended to LD_LIBRARY_PATH for the process."""
    log_file: Path | None = None
    """Where the process's output goes (default: `<state_dir>/logs/<model>-<port>.log`)."""
    log_lines: int = Field(default=1000, ge=10)
    """Output lines kept in memory for `GET /v1/admin/models/{id}/logs`."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for the engine's next bytes on a request."""
    container: ContainerOptions | None = None
    """Run the engine in this container image (Docker or Podman) instead of on this machine;
    see docs/engines.md. `env` and `pass_env` are then set inside the container;
    `library_path` does not apply. An admin's load-time override cannot change it."""

EngineProcess = ManagedProcess | ContainerProcess
EngineSpec = ProcessSpec | ContainerSpec


class ManagedServerBackend(ForwardingBackend, DeclaredBackend, ABC):
    """Subclasses say how to build the command line, where health is answered, and their
    capabilities (`capabilities_for` reads the engine's concurrency from its options)."""

    Options: ClassVar[type[ManagedOptions]]
    health_path: str = "/health"
    api_prefix: str = "/v1"
    engine_root: UpstreamClient | None = None
    """The engine's own routes, outside its OpenAI API (open while the engine is)."""
    api_key_env: str | None = None
    """The variable the engine reads the API key it demands from; None: it takes none."""

    def __init__(self, model: ModelConfig, options: ManagedOptions, context: BackendContext) -> None:
        self.model = model
        self.options = options
        self.hub = context.hub
        self._claimed = context.claimed
        self.gpus = context.gpus
        self.upstream_model = model.id
        self.registry = Registry(context.hub.state_dir)
        self.process: EngineProcess | None = None
        self._record_id: str | None = None
        self._recorded_in: Registry | None = None
        self._on_crash: Callable[[str], None] | None = None

    # ----- what subclasses provide ----------------------------------------------------

    @abstractmethod
    def command(self, weights: Path) -> list[str]:
        """The argv, with `{port}` where the port goes."""

    async def weights(self) -> Path:
        return await locate(self.model, self.hub)

    def files(self, weights: Path) -> list[Path]:
        """Host files the argv names, mounted into a container at the same path."""
        return [weights]

    @property
    def bind_host(self) -> str:
        """The address the engine binds to: inside a bridge-networked container, every one
        (the runtime publishes the port on `host` alone)."""
        container = self.options.container
        return "0.0.0.0" if container is not None and container.network == "bridge" else self.options.host

    @property
    def default_python(self) -> str:
        """The interpreter that runs a Python engine when none is configured: modelpool's own,
        or inside a container the image's `python3`."""
        return "python3" if self.options.container is not None else sys.executable

    # ----- lifecycle -----------------------------------------------------------------

    async def estimate_memory(self) -> MemoryEstimate:
        size = files_size(await self.weights())
        return MemoryEstimate(ram_bytes=int(size * 1.2) + 256 * 1024 * 1024)

    async def start(self) -> None:
        weights = await self.weights()
        if self.options.persistent and await self._adopt():
            return
        process_spec = self._spec(weights)
        spec: EngineSpec = process_spec
        process: EngineProcess
        if self.options.container is not None:
            spec = container_spec(process_spec, self.options.container, await self._runtime(), self.files(weights),
                                  persistent=self.options.persistent)  # fmt: skip
            process = ContainerProcess(spec, on_exit=self._exited)
        else:
            process = ManagedProcess(process_spec, on_exit=self._exited)
        try:  # recorded the moment it exists: a modelpool killed while it starts leaves a record
            await process.start(on_spawned=lambda pid: self._record(spec, pid))
        except BaseException:
            self._forget()
            raise
        self.process = process
        await self._connect(spec)

    def _spec(self, weights: Path) -> ProcessSpec:
        o = self.options
        port = o.port or free_port(o.host)
        if port_in_use(port, o.host):
            raise ModelLoadFailed(
                f"model '{self.model.id}': port {port} is already in use (set another `port`, or none for a free one)"
            )
        return ProcessSpec(
            name=self.model.id,
            argv=tuple(self.command(weights)),
            port=port,
            host=o.host,
            health_path=o.health_path or self.health_path,
            env=o.env,
            pass_env=tuple(o.pass_env),
            api_key=secrets.token_urlsafe(32) if self.api_key_env else None,
            api_key_env=self.api_key_env,
            library_path=tuple(o.library_path),
            start_timeout_s=o.start_timeout_s,
            stop_grace_s=o.stop_grace_s,
            log_file=o.log_file or self.registry.state_dir / "logs" / f"{self.model.id}-{port}.log",
            log_lines=o.log_lines,
            output_to_file=o.persistent,
            die_with_parent=not o.persistent,
        )

    async def warmup(self) -> None:
        return None  # the engine warms itself; a request here would only add start time

    async def stop(self) -> None:
        await self._disconnect()
        if self.process is not None:
            await self.process.stop()
            if self.process.pid is not None:
                self._claimed.release(self.process.pid)
        self._forget()

    async def detach(self) -> None:
        """modelpool is stopping: a persistent process keeps running (and is adopted next
        time); any other process is stopped."""
        if not self.options.persistent or self.process is None:
            await self.stop()
            return
        await self._disconnect()
        await self.process.detach()
        if self.process.pid is not None:
            self._claimed.release(self.process.pid)  # free for the next modelpool (in this process, in tests)
        log.info("left persistent process running", extra={"model": self.model.id, "pid": self.process.pid})

    async def check_health(self) -> None:
        if self.process is None or not self.process.running or not await self.process.check_health():
            raise UpstreamUnavailable(f"model '{self.model.id}': its engine process is not healthy")

    def supervise(self, on_crash: Callable[[str], None]) -> None:
        self._on_crash = on_crash

    def resident_bytes(self) -> int:
        pid = self.process.pid if self.process is not None else None
        return tree_rss(pid) if pid is not None else 0

    def log_tail(self, count: int) -> list[str]:
        return self.process.tail(count) if self.process is not None else []

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def port(self) -> int | None:
        return self.process.spec.port if self.process is not None else None

    # ----- internals -----------------------------------------------------------------

    def _exited(self, code: int | None) -> None:
        assert self.process is not None
        if code is None:
            how = "exited"  # an adopted process: only its parent learns the code
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        what = "container" if isinstance(self.process, ContainerProcess) else "process"
        message = f"engine {what} of '{self.model.id}' (pid {self.process.pid}) {how}"
        tail = self.process.last_lines(10)
        if tail:
            message += f"; last output:\n{tail}"
        if self._on_crash is not None:
            self._on_crash(message)

    async def _adopt(self) -> bool:
        """Take over a healthy process (or container) an earlier modelpool left running for
        this model."""
        for record in self.registry.find(kind=ENGINE_KIND, name=self.model.id):
            if record.pid in self._claimed or (self.options.port and record.port != self.options.port):
                continue
            process = await self._adoptable(record)
            if process is None:
                continue
            process.adopt(record.pid, record.started_at)
            self._claimed.claim(record.pid)
            self.process = process
            self._record_id, self._recorded_in = record.id, self.registry
            await self._connect(process.spec)
            return True
        return False

    async def _adoptable(self, record: ServiceRecord) -> EngineProcess | None:
        """The record's engine, ready to adopt: started the way the config says now (as a
        container or not), still the very container recorded, and healthy."""
        container = record.extra.get("container")
        if (self.options.container is None) != (container is None):
            return None
        spec = ProcessSpec(
            name=self.model.id,
            argv=(),
            port=record.port,
            host=self.options.host,
            health_path=record.health_path,
            api_key=self.registry.key(record.id),  # None: started by a modelpool that gave none
            stop_grace_s=self.options.stop_grace_s,
            log_file=Path(record.log_file) if record.log_file else None,
            log_lines=self.options.log_lines,
            output_to_file=record.log_file is not None,
        )
        process: EngineProcess
        if self.options.container is not None and isinstance(container, str):
            runtime = recorded_runtime(record) or await self._runtime()
            state = await inspect(runtime, container)
            if state is None or not state.running or state.pid != record.pid or not labelled(state, record):
                return None
            process = ContainerProcess(adopted_spec(spec, self.options.container, runtime, container), self._exited)
        else:
            process = ManagedProcess(spec, on_exit=self._exited)
        return process if await process.check_health() else None

    async def _runtime(self) -> Runtime:
        assert self.options.container is not None
        return await find_runtime(self.options.container.runtime)

    def _record(self, spec: EngineSpec, pid: int) -> None:
        """A persistent process goes into the registry later modelpools adopt from, with
        its key beside it; any other into the one of engines that die with their owner."""
        record = ServiceRecord(
            id=f"{ENGINE_KIND}:{self.model.id}@{spec.port}",
            name=self.model.id,
            kind=ENGINE_KIND,
            pid=pid,
            port=spec.port,
            url=spec.base_url,
            started_at=create_time(pid) or 0.0,
            log_file=str(spec.log_file) if spec.log_file else None,
            health_path=spec.health_path,
            extra=container_record(spec) if isinstance(spec, ContainerSpec) else {},
        )
        if self.options.persistent:
            registry = self.registry
            self._claimed.claim(pid)
        else:
            registry = owned_engines(self.registry.state_dir)
            record = owned_record(record, spec.stop_grace_s)
        registry.put(record)  # first: putting prunes the key of a dead entry of the same id
        if self.options.persistent and spec.api_key is not None:
            registry.save_key(record.id, spec.api_key)
        self._record_id, self._recorded_in = record.id, registry

    def _forget(self) -> None:
        if self._record_id is not None and self._recorded_in is not None:
            self._recorded_in.remove(self._record_id)
        self._record_id = self._recorded_in = None

    def _client(self, spec: EngineSpec, prefix: str) -> UpstreamClient:
        # No retries: a connection error to our own process means it is gone, and the crash
        # handler restarts it; retrying would only delay the client's error.
        return UpstreamClient(
            self.model.id,
            spec.base_url + prefix,
            api_key=spec.api_key,
            retry=RetryPolicy(retries=0),
            timeouts=UpstreamTimeouts(connect_s=5.0, read_s=self.options.request_timeout_s),
            keepalive_s=ENGINE_KEEPALIVE_S,  # idle connections dropped before the engine drops them
        )

    async def _connect(self, spec: EngineSpec) -> None:
        self.upstream = self._client(spec, self.api_prefix)
        await self.upstream.open()
        self.engine_root = self._client(spec, "")  # the engines' own routes (/tokenize) sit outside /v1
        await self.engine_root.open()

    async def _disconnect(self) -> None:
        for client in (self.upstream, self.engine_root):
            if client is not None:
                await client.close()
        self.upstream = self.engine_root = None

