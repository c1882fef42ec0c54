"""Calls of a container runtime's CLI that run to their end (inspect, stop, kill, login),
and what a registry record says of a container: used by `containers.ContainerProcess`, the
reaper and `modelpool stop-persistent`."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from modelpool.errors import ModelLoadFailed
from modelpool.services.container_argv import (
    LABEL_MODEL,
    LABEL_PORT,
    ContainerSpec,
    Runtime,
    info_argv,
    inspect_argv,
    kill_argv,
    runtime_candidates,
    stop_argv,
    tool_environment,
)
from modelpool.services.registry import ServiceRecord

log = logging.getLogger("modelpool.services")
CLI_TIMEOUT_S = 120.0
"""Longest wait for one runtime call that should be quick (inspect, login, kill)."""
PROBE_TIMEOUT_S = 15.0
"""Longest wait for `info` when `auto` probes a runtime (a daemon that is not there fails fast)."""
_answered: dict[tuple[str, ...], Runtime] = {}
"""`auto`'s choice per set of candidates found: probed once per modelpool, not per load."""


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


async def call(argv: list[str], env: dict[str, str], *, stdin: bytes | None = None,
               timeout_s: float = CLI_TIMEOUT_S) -> CliResult:  # fmt: skip
    """Run one runtime command to its end; a runtime that cannot be run is a ModelLoadFailed."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C to modelpool must not cut a `stop` short
        )
    except OSError as error:
        raise ModelLoadFailed(f"cannot run the container runtime {argv[0]}: {error.strerror}") from error
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), timeout_s)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return CliResult(124, "", f"{argv[0]} {argv[1]} did not answer within {timeout_s:.0f}s")
    assert process.returncode is not None
    return CliResult(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def find_runtime(configured: str) -> Runtime:
    """The runtime `container.runtime` names. `auto` takes the first of docker and podman on
    PATH that answers `info`: a `docker` client with no daemon behind it (a common leftover on
    machines that run Podman) must not be chosen only because it comes first."""
    candidates = runtime_candidates(configured)
    if configured != "auto":
        return candidates[0]
    key = tuple(runtime.path for runtime in candidates)
    if key in _answered:
        return _answered[key]
    problems = []
    for runtime in candidates:
        done = await call(info_argv(runtime), tool_environment(), timeout_s=PROBE_TIMEOUT_S)
        if done.code == 0:
            _answered[key] = runtime
            return runtime
        reason = tail_of(done.err, 1) or f"exit code {done.code}"
        problems.append(f"`{runtime.path} info` failed: {reason}")
    raise ModelLoadFailed(f"no container runtime answers ({'; '.join(problems)}); name one in container.runtime")


@dataclass(frozen=True)
class ContainerState:
    running: bool
    pid: int
    labels: dict[str, str]


async def inspect(runtime: Runtime, container: str, env: dict[str, str] | None = None) -> ContainerState | None:
    """The container's state and labels; None when there is no such container."""
    done = await call(inspect_argv(runtime, container), env or tool_environment())
    if done.code != 0:
        return None
    state_json, _, labels_json = done.out.strip().partition("|")
    try:
        state: dict[str, Any] = json.loads(state_json)
        labels = json.loads(labels_json) or {}
    except ValueError:
        return None
    return ContainerState(bool(state.get("Running")), int(state.get("Pid") or 0), dict(labels))


async def stop_container(runtime: Runtime, container: str, grace_s: float, *, name: str = "") -> str:
    """`stop -t grace` (SIGTERM, then the runtime's SIGKILL), then `kill` if it is still
    running. Returns "gone" (not running), "terminated" or "killed"."""
    env = tool_environment()
    state = await inspect(runtime, container, env)
    if state is None or not state.running:
        return "gone"
    await call(stop_argv(runtime, container, grace_s), env, timeout_s=grace_s + CLI_TIMEOUT_S)
    state = await inspect(runtime, container, env)
    if state is None or not state.running:
        return "terminated"
    log.warning("container still running after stop; killing it", extra={"service": name, "container": container})
    await call(kill_argv(runtime, container), env)
    return "killed"


def container_record(spec: ContainerSpec) -> dict[str, Any]:
    """A record's `extra` for a container: how to reach it again (the reaper, stop-persistent,
    adoption)."""
    return {"container": spec.container, "runtime": spec.runtime.path, "runtime_kind": spec.runtime.kind}


async def stop_recorded_container(record: ServiceRecord, grace_s: float) -> str:
    """Stop the container a record names, if it is still the one recorded (same init pid,
    the model's labels): "gone", "terminated" or "killed"."""
    runtime, container = recorded_runtime(record), record.extra.get("container")
    if runtime is None or not isinstance(container, str):
        return "gone"
    state = await inspect(runtime, container)
    if state is None or not state.running or state.pid != record.pid or not labelled(state, record):
        return "gone"  # not the container recorded: never stopped from a record
    return await stop_container(runtime, container, grace_s, name=record.name)


def labelled(state: ContainerState, record: ServiceRecord) -> bool:
    """The container carries the labels of the record's model and port."""
    return state.labels.get(LABEL_MODEL) == record.name and state.labels.get(LABEL_PORT) == str(record.port)


def recorded_runtime(record: ServiceRecord) -> Runtime | None:
    path, kind = record.extra.get("runtime"), record.extra.get("runtime_kind")
    if isinstance(path, str) and kind in ("docker", "podman"):
        return Runtime(path, kind)
    return None


def tail_of(text: str, count: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-count:])
