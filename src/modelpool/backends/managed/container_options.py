"""`options.container` of a managed backend: run the engine in a container image instead of
as a process of this machine. The config is the operator's word, but what it says ends up on
a runtime's command line, so every value is checked against what it may be there: an image
reference, a container name, bind mounts, variable names, and `run_args` from an allow list
(a flag that widens the container's privileges, reaches the host's devices, namespaces or
files, or replaces what modelpool sets is a clear config error)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

IMAGE_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
"""`[registry[:port]/]path[:tag][@sha256:digest]`, as Docker's reference grammar has it."""
CONTAINER_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$"
VARIABLE_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
USER_NAME = r"[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,63}"
NO_SEPARATOR = re.compile(r"^[^:,\x00\n]+$")
"""A bind mount's paths go into `-v SOURCE:TARGET:ro`: no colon, comma, NUL or newline."""

_RUN_FLAGS_WITH_VALUE = (
    "--cpus --cpuset-cpus --cpuset-mems --cpu-shares --cpu-period --cpu-quota --memory -m --memory-swap "
    "--memory-reservation --pids-limit --ulimit --tmpfs --workdir -w --hostname --add-host --dns "
    "--dns-search --platform --stop-signal --stop-timeout --oom-score-adj"
)
RUN_FLAGS: dict[str, bool] = {
    **dict.fromkeys(_RUN_FLAGS_WITH_VALUE.split(), True),
    **dict.fromkeys(["--init", "--read-only"], False),
}
"""Flags `run_args` may hold (flag → takes a value): resources, limits and names. Not on it,
among others: --privileged, --cap-add, --security-opt, --device, --gpus, -v/--volume,
--mount, --volumes-from, --pid, --ipc, --userns, --uts, --cgroupns, --network, -p, -e,
--env-file, --user, --group-add, --sysctl, --name, --entrypoint, --rm, --restart, --label,
--label-file, --log-driver, --log-opt: they widen what the container may do or replace what modelpool sets."""


def run_args_problem(args: list[str]) -> str | None:
    """Why `args` are not acceptable `run` flags; None when they are. Every token is an
    allowed flag or the value right after one that takes a value (a stray word would be
    read as the image)."""
    expects_value = False
    for token in args:
        if expects_value:
            expects_value = False
            if token.startswith("-"):
                return f"'{token}' stands where a value belongs; a value may not look like a flag"
            continue
        name, has_inline, value = token.partition("=")
        takes_value = RUN_FLAGS.get(name)
        if takes_value is None:
            return (f"'{name}' is not allowed in container.run_args (it could widen the container's privileges, "
                    f"or replaces what modelpool sets); allowed: {', '.join(sorted(RUN_FLAGS))}")  # fmt: skip
        if has_inline and (not takes_value or not value):
            return f"'{token}': {name} takes {'a value' if takes_value else 'no value'}"
        expects_value = takes_value and not has_inline
    return "container.run_args end with a flag that needs a value" if expects_value else None


class BindMount(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    source: Path
    """Host path (`~` is expanded)."""
    target: str
    """Absolute path inside the container."""
    read_only: bool = True

    @field_validator("source", mode="after")
    @classmethod
    def _expand(cls, source: Path) -> Path:
        expanded = source.expanduser()
        if not expanded.is_absolute() or not NO_SEPARATOR.match(str(expanded)):
            raise ValueError(f"mount source '{source}' must be an absolute path (or start with ~) "
                             "without ':' or ','")  # fmt: skip
        return expanded

    @field_validator("target", mode="after")
    @classmethod
    def _absolute(cls, target: str) -> str:
        if not target.startswith("/") or not NO_SEPARATOR.match(target) or "/../" in f"{target}/":
            raise ValueError(f"mount target '{target}' must be an absolute path without ':', ',' or '..'")
        return target


class RegistryLogin(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    registry: str = Field(pattern=r"^[a-zA-Z0-9](?:[a-zA-Z0-9.-]{0,253})(?::[0-9]{1,5})?$")
    """Registry host (`nvcr.io`, `localhost:5000`)."""
    username: str = Field(pattern=r"^[^\s\x00-\x1f-][^\s\x00-\x1f]{0,254}$")
    password_env: str = Field(pattern=VARIABLE_NAME)
    """The NAME of the variable the password or token is in; no login when it is unset. It
    is written to the runtime's `login --password-stdin`, never onto a command line."""


class ContainerOptions(BaseModel):
    """Run the engine in a container. Its argv (the same as without one) runs inside:
    argv[0] as entrypoint. The weights are mounted read-only at the same path."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    image: str = Field(max_length=512)
    """Image reference, e.g. `ghcr.io/ggml-org/llama.cpp:server`."""
    runtime: str = Field(default="auto", pattern=r"^(auto|docker|podman|/[^\x00\n]{1,4095})$")
    """`auto` (the first of `docker`, `podman` on PATH whose `info` answers: a docker client
    without a daemon is passed over), `docker`, `podman`, or an absolute path to either."""
    name: str | None = Field(default=None, pattern=CONTAINER_NAME)
    """Container name (default `modelpool-<model id>-<port>`)."""
    gpus: str | None = Field(default=None, pattern=r"^(all|[0-9]{1,3}(,[0-9]{1,3}){0,63})$")
    """GPUs to hand in: `all` or indices `0,1` (Docker `--gpus`; Podman CDI
    `--device nvidia.com/gpu=...`)."""
    mounts: list[BindMount] = Field(default_factory=list, max_length=32)
    """Further bind mounts (read-only unless `read_only: false`)."""
    hf_cache: bool = False
    """Mount the host's Hugging Face cache (read-write, at the same path) and set HF_HOME inside to it."""
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    """Variables set inside the container (passed by name, so values never show on a command line)."""
    network: Literal["host", "bridge"] = "host"
    """`host`: the host's network; `bridge`: its own, with the port published on `host`."""
    ipc: Literal["host"] | None = None
    """`host`: the host's IPC namespace (vLLM's shared memory between workers)."""
    shm_size: str | None = Field(default=None, pattern=r"^[1-9][0-9]{0,12}[bkmgBKMG]?$")
    """Size of /dev/shm, e.g. `8g`."""
    pull: Literal["missing", "always", "never"] = "missing"
    """When to pull the image."""
    user: str | None = Field(default=None, pattern=rf"^{USER_NAME}(:{USER_NAME})?$")
    """User (`uid[:gid]` or a name) the engine runs as inside."""
    login: RegistryLogin | None = None
    """Log in to a registry before running (when its password variable is set)."""
    run_args: list[str] = Field(default_factory=list, max_length=64)
    """Further `run` flags, from an allow list of resource and limit flags (`--cpus`,
    `--memory`, `--ulimit`, `--init`, ...); anything that widens privileges or replaces what
    modelpool sets is a config error."""

    @field_validator("image", mode="after")
    @classmethod
    def _image(cls, image: str) -> str:
        if not IMAGE_REFERENCE.match(image):
            raise ValueError(f"'{image}' is not an image reference ([registry/]name[:tag][@sha256:digest])")
        return image

    @field_validator("env", mode="after")
    @classmethod
    def _variables(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not re.match(VARIABLE_NAME, name):
                raise ValueError(f"'{name}' is not a variable name")
            if "\x00" in value:
                raise ValueError(f"the value of {name} holds a NUL byte")
        return env

    @field_validator("run_args", mode="after")
    @classmethod
    def _run_args(cls, args: list[str]) -> list[str]:
        problem = run_args_problem(args)
        if problem is not None:
            raise ValueError(problem)
        return args
