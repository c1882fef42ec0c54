"""Stack files: the services an application needs (modelpool servers and external
commands), how to start each, on which port, and in which order.

    name: agent                 # default: the stack file's directory name
    port_base: 8100             # where `port: auto` starts looking
    services:
      llm:
        modelpool: {models: [smollm2]}   # config: llm.yaml next to this file, if there
        persistent: true
      speech:
        modelpool: {config: speech-models.yaml}
        port: 8200
      app:
        command: [python, app.py, --llm, "{llm.url}", --port, "{port}"]
        health_path: /ping
        depends_on: [llm, speech]

`model_backend` (the agent sample's switch, `local` by default) says where the models run;
a service with `replaced_by: [nim]` is not started when it is `nim` (a hosted overlay
replaces it), and what depends on it no longer waits for it. `model_backend_file` reads the
key from the worker's own YAML instead, so one line switches both, as in the sample;
`modelpool up --model-backend` overrides both. `credentials: {nim: [NGC_API_KEY]}` names
the keys a backend needs: `up` refuses to start without them (docs/stacks.md).

Placeholders in `command` and `env` values: `{port}`, `{host}`, `{url}`, `{config}`, and
`{<service>.url}` / `{<service>.port}` of the services it depends on. Other braces are
left alone, so JSON arguments need no escaping.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from modelpool.config.loader import read_yaml_mapping, validation_problems
from modelpool.errors import ConfigError

DEFAULT_STACK_FILE = "stack.yaml"
DEFAULT_BACKEND = "local"
BACKEND_NAME = r"^[A-Za-z0-9_-]{1,32}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
DEFAULT_PORT_BASE = 8100
MODELPOOL_KIND = "modelpool"
COMMAND_KIND = "command"
SERVICE_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]*"
_PLACEHOLDER = re.compile(r"\{(" + SERVICE_NAME + r")(?:\.(url|port))?\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ModelpoolService(_Strict):
    config: Path | None = None
    """Its config file, relative to the stack file (default: `<service>.yaml` beside the
    stack file when there is one, else modelpool's defaults)."""
    models: list[str] | None = None
    """Serve only these model ids (`modelpool serve --models`)."""
    args: list[str] = Field(default_factory=list)
    """More `modelpool serve` arguments."""


class ServiceSpec(_Strict):
    modelpool: ModelpoolService | None = None
    """A modelpool server with its own config."""
    command: list[str] | None = None
    """An external command (argv, no shell)."""
    config: Path | None = None
    """For a command: the file `{config}` stands for (default: `<service>.yaml` beside the
    stack file, when there is one)."""
    cwd: Path | None = None
    """A command's working directory (default: the stack file's directory)."""
    port: Annotated[int, Field(ge=1, le=65535)] | Literal["auto"] = "auto"
    """A port used as is (an error if it is busy), or `auto`: the lowest free one from
    `port_base` that no registered service uses."""
    host: str = "127.0.0.1"
    health_path: str | None = None
    """Polled until it answers 200 (default: /readyz for modelpool, /health for commands)."""
    env: dict[str, str] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    """Started, and ready, before this one."""
    persistent: bool = False
    """Keeps running when the foreground `modelpool up` stops or dies; the next `up` reuses it."""
    start_timeout_s: float | None = Field(default=None, gt=0)
    """How long to wait for health (default: 600 s for modelpool, which may load models; 120 s)."""
    stop_grace_s: float = Field(default=20.0, ge=0)
    """Between SIGTERM and SIGKILL on `down`."""
    replaced_by: list[Annotated[str, Field(pattern=BACKEND_NAME)]] = Field(default_factory=list)
    """Model backends that replace this service (`[nim]`): not started under them."""

    @model_validator(mode="after")
    def _one_kind(self) -> ServiceSpec:
        if (self.modelpool is None) == (self.command is None):
            raise ValueError("give exactly one of `modelpool` or `command`")
        if self.command is not None and not self.command:
            raise ValueError("`command` must not be empty")
        return self


class StackFile(_Strict):
    name: str | None = None
    port_base: Annotated[int, Field(ge=1024, le=65000)] = DEFAULT_PORT_BASE
    model_backend: Annotated[str, Field(pattern=BACKEND_NAME)] = DEFAULT_BACKEND
    """Where the models run: `local`, or a hosted backend such as `nim`."""
    model_backend_file: Path | None = None
    """A YAML file (relative to the stack file) whose `model_backend` key decides instead:
    the worker's config, which also picks its models file (`models.nim.yaml` for nim)."""
    credentials: dict[Annotated[str, Field(pattern=BACKEND_NAME)], list[Annotated[str, Field(pattern=ENV_NAME)]]] = (
        Field(default_factory=dict)
    )
    """Backend → the keys it needs (environment, `.env` beside the stack file, or saved)."""
    services: dict[str, ServiceSpec]


@dataclass(frozen=True)
class Service:
    """One service as `up` starts it: its spec with defaults and paths resolved."""

    name: str
    kind: str
    spec: ServiceSpec
    config_file: Path | None
    cwd: Path

    @property
    def health_path(self) -> str:
        return self.spec.health_path or ("/readyz" if self.kind == MODELPOOL_KIND else "/health")

    @property
    def start_timeout_s(self) -> float:
        return self.spec.start_timeout_s or (600.0 if self.kind == MODELPOOL_KIND else 120.0)

    def fingerprint(self) -> str:
        """Changes when the definition or its config file does: a reused service that no
        longer matches is pointed out instead of silently kept."""
        digest = hashlib.sha256(self.spec.model_dump_json().encode())
        if self.config_file is not None:
            try:
                digest.update(self.config_file.read_bytes())
            except OSError:  # gone or unreadable: the service itself reports it, naming the file
                digest.update(b"(unreadable)")
        return digest.hexdigest()[:16]

    def argv(self, host: str, port: int, peers: Mapping[str, tuple[str, int]]) -> list[str]:
        """The command line with placeholders filled in (`peers`: name → (url, port))."""
        if self.spec.command is not None:
            return [self._fill(arg, host, port, peers) for arg in self.spec.command]
        assert self.spec.modelpool is not None
        argv = [sys.executable, "-m", "modelpool", "serve", "--host", host, "--port", str(port)]
        if self.config_file is not None:
            argv += ["--config", str(self.config_file)]
        if self.spec.modelpool.models:
            argv += ["--models", ",".join(self.spec.modelpool.models)]
        return argv + [self._fill(arg, host, port, peers) for arg in self.spec.modelpool.args]

    def environment(self, host: str, port: int, peers: Mapping[str, tuple[str, int]]) -> dict[str, str]:
        return {key: self._fill(value, host, port, peers) for key, value in self.spec.env.items()}

    def _fill(self, text: str, host: str, port: int, peers: Mapping[str, tuple[str, int]]) -> str:
        own = {"port": str(port), "host": host, "url": f"http://{host}:{port}", "config": str(self.config_file or "")}

        def replace(match: re.Match[str]) -> str:
            name, field = match.group(1), match.group(2)
            if field is None:
                return own.get(name, match.group(0))
            if name not in peers:
                return match.group(0)  # validated at load time: only dependencies are named
            url, peer_port = peers[name]
            return url if field == "url" else str(peer_port)

        return _PLACEHOLDER.sub(replace, text)


@dataclass(frozen=True)
class Stack:
    name: str
    file: Path
    port_base: int
    services: dict[str, Service]
    """In dependency order: every service comes after those it depends on (those the model
    backend replaces are left out)."""
    model_backend: str = DEFAULT_BACKEND
    replaced: tuple[str, ...] = ()
    """Services the model backend replaces: not started, not waited for."""
    credentials: tuple[str, ...] = ()
    """Keys the model backend needs."""

    def closure(self, names: list[str]) -> list[Service]:
        """The named services and everything they depend on, in dependency order."""
        unknown = [n for n in names if n not in self.services]
        if unknown:
            raise ConfigError(f"stack {self.name!r} has no service {', '.join(map(repr, unknown))}")
        wanted: set[str] = set()
        pending = list(names)
        while pending:
            name = pending.pop()
            if name not in wanted:
                wanted.add(name)
                pending += self.services[name].spec.depends_on
        return [s for s in self.services.values() if s.name in wanted]


def load_stack(path: Path, model_backend: str | None = None) -> Stack:
    """Read and check a stack file; ConfigError says what is wrong and where.
    `model_backend` overrides the file's (`modelpool up --model-backend`)."""
    path = path.resolve()
    raw = read_yaml_mapping(path, "stack file")
    try:
        parsed = StackFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid stack file {path}: {validation_problems(exc)}") from None
    _check_names_and_ports(parsed, path)
    backend = model_backend or _backend_of(parsed, path)
    if not re.fullmatch(BACKEND_NAME, backend):
        raise ConfigError(f"model_backend {backend[:40]!r} may hold only letters, digits, '_' and '-'")
    replaced = [name for name, spec in parsed.services.items() if backend in spec.replaced_by]
    kept = {name: spec for name, spec in parsed.services.items() if name not in replaced}
    for spec in kept.values():
        spec.depends_on = [d for d in spec.depends_on if d not in replaced]  # the hosted one needs no waiting for
    order = _dependency_order({name: spec.depends_on for name, spec in kept.items()}, path)
    services = {name: _service(name, kept[name], path) for name in order}
    for service in services.values():
        _check_placeholders(service, path, replaced, backend)
    credentials = tuple(parsed.credentials.get(backend, ()))
    return Stack(parsed.name or path.parent.name, path, parsed.port_base, services, backend, tuple(replaced),
                 credentials)  # fmt: skip


def _backend_of(parsed: StackFile, path: Path) -> str:
    """The stack's model backend: the `model_backend` key of `model_backend_file` (absent
    key: `local`, as the sample's worker reads it), else the stack file's own."""
    if parsed.model_backend_file is None:
        return parsed.model_backend
    file = (
        parsed.model_backend_file
        if parsed.model_backend_file.is_absolute()
        else path.parent / parsed.model_backend_file
    )
    value = read_yaml_mapping(file, "model_backend_file").get("model_backend", DEFAULT_BACKEND)
    return str(value).lower()


def _service(name: str, spec: ServiceSpec, path: Path) -> Service:
    base = path.parent
    explicit = spec.modelpool.config if spec.modelpool is not None else spec.config
    config_file: Path | None
    if explicit is not None:
        config_file = explicit if explicit.is_absolute() else base / explicit
        if not config_file.is_file():
            raise ConfigError(f"stack file {path}: service {name!r}: config file not found: {config_file}")
    else:
        discovered = base / f"{name}.yaml"
        config_file = discovered if discovered.is_file() else None
    cwd = spec.cwd if spec.cwd is None or spec.cwd.is_absolute() else base / spec.cwd
    kind = MODELPOOL_KIND if spec.modelpool is not None else COMMAND_KIND
    return Service(name, kind, spec, config_file, cwd or base)


def _check_names_and_ports(parsed: StackFile, path: Path) -> None:
    if not parsed.services:
        raise ConfigError(f"stack file {path} lists no services")
    for name, spec in parsed.services.items():
        if not re.fullmatch(SERVICE_NAME, name):
            raise ConfigError(f"stack file {path}: service name {name!r} may hold only letters, digits, '_' and '-'")
        missing = [d for d in spec.depends_on if d not in parsed.services]
        if missing:
            raise ConfigError(f"stack file {path}: service {name!r} depends on unknown {', '.join(missing)}")
    by_port: dict[int, str] = {}
    for name, spec in parsed.services.items():
        if isinstance(spec.port, int):
            if spec.port in by_port:
                other = by_port[spec.port]
                raise ConfigError(f"stack file {path}: services {other!r} and {name!r} share port {spec.port}")
            by_port[spec.port] = name


def _dependency_order(depends_on: dict[str, list[str]], path: Path) -> list[str]:
    """Topological order, stable in file order; a cycle is an error that names it."""
    order: list[str] = []
    state: dict[str, str] = {}  # "visiting" | "done"

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = [*trail[trail.index(name) :], name]
            raise ConfigError(f"stack file {path}: dependency cycle {' -> '.join(cycle)}")
        state[name] = "visiting"
        for dependency in depends_on[name]:
            visit(dependency, [*trail, name])
        state[name] = "done"
        order.append(name)

    for name in depends_on:
        visit(name, [])
    return order


def _check_placeholders(service: Service, path: Path, replaced: list[str], backend: str) -> None:
    texts = [*(service.spec.command or []), *service.spec.env.values()]
    if service.spec.modelpool is not None:
        texts += service.spec.modelpool.args
    for text in texts:
        for match in _PLACEHOLDER.finditer(text):
            name, field = match.group(1), match.group(2)
            if field is not None and name in replaced:
                raise ConfigError(
                    f"stack file {path}: service {service.name!r} uses {match.group(0)}, but model_backend "
                    f"{backend} replaces {name!r}: under {backend} it must find the hosted one another way"
                )
            if field is not None and name not in service.spec.depends_on:
                raise ConfigError(
                    f"stack file {path}: service {service.name!r} uses {match.group(0)} but does not depend on {name!r}"
                )
