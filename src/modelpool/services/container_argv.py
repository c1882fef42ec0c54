"""What an engine run as a container is, and the container runtime's command lines for it:
pure functions of a `ContainerSpec`, the same for Docker and Podman except where their CLIs
differ (GPUs). `services.containers` runs them.

Secrets never reach a command line (`ps` shows it to every local user): a variable set
inside the container is passed as `-e NAME`, which makes the runtime's client copy the value
from its own environment, and a registry password goes to `login --password-stdin`."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from modelpool.config.environment import engine_environment
from modelpool.errors import ModelLoadFailed

RuntimeKind = Literal["docker", "podman"]
RUNTIMES: tuple[RuntimeKind, ...] = ("docker", "podman")

TOOL_VARIABLES = (
    "CONTAINERS_CONF", "CONTAINERS_REGISTRIES_CONF", "CONTAINERS_STORAGE_CONF", "REGISTRY_AUTH_FILE",
    "CONTAINER_HOST", "CONTAINER_CONNECTION", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "HOME", "PATH",
)  # fmt: skip
"""Variables of modelpool's environment the runtime's client needs (where its daemon or
storage is, its settings and credentials); besides them it gets only the engine allowlist."""

LABEL_MODEL = "io.modelpool.model"
LABEL_PORT = "io.modelpool.port"
LABEL_OWNER = "io.modelpool.owner"


@dataclass(frozen=True)
class Runtime:
    path: str
    """The client's executable."""
    kind: RuntimeKind


def runtime_candidates(configured: str) -> list[Runtime]:
    """`auto`: docker and podman, those on PATH, in that order (`container_cli.find_runtime`
    takes the first that answers); `docker`/`podman`: that one on PATH; a path: that file (its
    kind from its name). None there is a ModelLoadFailed naming what was looked for."""
    names = RUNTIMES if configured == "auto" else (configured,)
    found = [Runtime(path, runtime_kind(name)) for name in names if (path := shutil.which(name)) is not None]
    if found:
        return found
    if configured == "auto":
        raise ModelLoadFailed("no container runtime: neither `docker` nor `podman` is on PATH (container.runtime)")
    raise ModelLoadFailed(f"container runtime '{configured}' is not an executable on PATH or a path to one")


def runtime_kind(name: str) -> RuntimeKind:
    return "podman" if "podman" in Path(name).name else "docker"


@dataclass(frozen=True)
class BindMount:
    source: Path
    target: str
    read_only: bool = True

    def argument(self) -> str:
        return f"{self.source}:{self.target}{':ro' if self.read_only else ''}"


@dataclass(frozen=True)
class Login:
    registry: str
    username: str
    password_env: str
    """The NAME of the variable the password is in."""


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    """Who it is in logs and errors: the model id."""
    container: str
    """The container's name (`modelpool-<model>-<port>` by default)."""
    runtime: Runtime
    image: str
    argv: tuple[str, ...]
    """Run inside: argv[0] is the entrypoint. `{port}` is replaced by the port."""
    port: int
    host: str = "127.0.0.1"
    health_path: str = "/health"
    mounts: tuple[BindMount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Set inside the container (passed by name)."""
    pass_env: tuple[str, ...] = ()
    """Variables of modelpool's environment handed in as they are (by name)."""
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    network: Literal["host", "bridge"] = "host"
    ipc: Literal["host"] | None = None
    shm_size: str | None = None
    gpus: str | None = None
    pull: Literal["missing", "always", "never"] = "missing"
    user: str | None = None
    login: Login | None = None
    run_args: tuple[str, ...] = ()
    start_timeout_s: float = 600.0
    stop_grace_s: float = 20.0
    log_file: Path | None = None
    log_lines: int = 1000

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv_with_port(self) -> list[str]:
        return [arg.replace("{port}", str(self.port)) for arg in self.argv]

    def client(self, *args: str) -> list[str]:
        return [self.runtime.path, *args]


def run_argv(spec: ContainerSpec) -> list[str]:
    """`run --rm` with the spec's name, labels, network, devices, mounts and variables (by
    name), the engine's argv[0] as entrypoint and the rest as its arguments. Attached (not
    `-d`): the client relays the engine's output to the end (a `logs -f` of a `--rm`
    container loses its last lines, the ones that say why it died) and exits with its code.
    `--sig-proxy=false`: ending the client leaves the container running (detach)."""
    if not spec.argv:
        raise ValueError("a container spec needs the engine's argv")
    argv = spec.client("run", "--rm", "--sig-proxy=false", "--name", spec.container, "--pull", spec.pull)
    for key, value in spec.labels.items():
        argv += ["--label", f"{key}={value}"]
    if spec.network == "host":
        argv += ["--network", "host"]
    else:
        argv += ["--network", "bridge", "-p", f"{spec.host}:{spec.port}:{spec.port}"]
    argv += gpu_arguments(spec.runtime.kind, spec.gpus)
    argv += ["--ipc", spec.ipc] if spec.ipc else []
    argv += ["--shm-size", spec.shm_size] if spec.shm_size else []
    argv += ["--user", spec.user] if spec.user else []
    for mount in spec.mounts:
        argv += ["-v", mount.argument()]
    for name in inside_variables(spec):
        if name in TOOL_VARIABLES and name in spec.env:  # the client needs its own; these are no secrets
            argv += ["-e", f"{name}={spec.env[name]}"]
        else:
            argv += ["-e", name]  # the value comes from the client's environment, never from here
    argv += [*spec.run_args, "--entrypoint", spec.argv[0], spec.image]
    return argv + spec.argv_with_port[1:]


def gpu_arguments(kind: RuntimeKind, gpus: str | None) -> list[str]:
    """Docker: `--gpus all` / `--gpus "device=0,1"` (the quotes keep the comma inside one CSV
    field); Podman: CDI devices, `--device nvidia.com/gpu=all` or one per index."""
    if not gpus:
        return []
    if kind == "docker":
        return ["--gpus", "all" if gpus == "all" else f'"device={gpus}"']
    indices = ["all"] if gpus == "all" else gpus.split(",")
    return [arg for index in indices for arg in ("--device", f"nvidia.com/gpu={index}")]


def inside_variables(spec: ContainerSpec) -> list[str]:
    names = [*spec.env, *spec.pass_env, *([spec.api_key_env] if spec.api_key_env and spec.api_key else [])]
    return list(dict.fromkeys(names))


def client_environment(spec: ContainerSpec) -> dict[str, str]:
    """The runtime client's environment: the engine allowlist, the container tools' variables,
    what the spec hands in (so that `-e NAME` finds it), and the engine's key."""
    env = engine_environment({}, (*TOOL_VARIABLES, *spec.pass_env))
    for name, value in spec.env.items():
        if name not in TOOL_VARIABLES:  # the client's own PATH/HOME stay; `run_argv` sets these inside
            env[name] = value
    if spec.api_key_env is not None and spec.api_key is not None:
        env[spec.api_key_env] = spec.api_key
    return env


def tool_environment() -> dict[str, str]:
    """The environment of a runtime call that hands nothing in (stop, inspect, logs)."""
    return engine_environment({}, TOOL_VARIABLES)


def info_argv(runtime: Runtime) -> list[str]:
    """Answers (exit 0) only when the runtime can run containers: Docker's client without a
    reachable daemon fails here, Podman's checks its storage and settings."""
    return [runtime.path, "info", "--format", "{{json .}}"]


def login_argv(runtime: Runtime, login: Login) -> list[str]:
    return [runtime.path, "login", "--username", login.username, "--password-stdin", login.registry]


def stop_argv(runtime: Runtime, container: str, grace_s: float) -> list[str]:
    return [runtime.path, "stop", "-t", str(max(0, round(grace_s))), container]


def kill_argv(runtime: Runtime, container: str) -> list[str]:
    return [runtime.path, "kill", container]


def logs_argv(runtime: Runtime, container: str, *, since_now: bool = False) -> list[str]:
    return [runtime.path, "logs", "-f", *(["--tail", "0"] if since_now else []), container]


def wait_argv(runtime: Runtime, container: str) -> list[str]:
    return [runtime.path, "wait", container]


def inspect_argv(runtime: Runtime, container: str) -> list[str]:
    return [runtime.path, "inspect", "--type", "container", "--format", "{{json .State}}|{{json .Config.Labels}}",
            container]  # fmt: skip


def default_name(model_id: str, port: int) -> str:
    """`modelpool-<model>-<port>`: predictable, and replicas differ by port. Characters a
    container name may not hold become `-`."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-" for c in model_id)
    return f"modelpool-{cleaned[:100]}-{port}"
