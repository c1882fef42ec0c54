"""A managed backend's engine as a container: the `ContainerSpec` its options make, and the
mounts that let the engine's argv stay as it is (the weights at the same path, read-only)."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import constants as hf_constants

from modelpool.backends.managed.container_options import NO_SEPARATOR, ContainerOptions
from modelpool.errors import ModelLoadFailed
from modelpool.services.container_argv import (
    LABEL_MODEL,
    LABEL_OWNER,
    LABEL_PORT,
    BindMount,
    ContainerSpec,
    Login,
    Runtime,
    default_name,
)
from modelpool.services.pids import create_time
from modelpool.services.process import ProcessSpec


def weights_mount(path: Path) -> BindMount | None:
    """The weights, read-only at the same path. A file or folder inside a Hugging Face cache
    is a link (or a folder of links) into the repo's `blobs/`: the whole repo folder goes in,
    so the links resolve inside too. None for a path that is not there (a Hub id vLLM fetches)."""
    if not path.is_absolute() or not path.exists():
        return None
    source = path
    for parent in path.parents:
        if parent.name.startswith("models--") and (parent / "blobs").is_dir():
            source = parent
            break
    if not NO_SEPARATOR.match(str(source)):
        raise ModelLoadFailed(f"weights path {source} holds ':' or ',', which a bind mount cannot take")
    return BindMount(source, str(source))


def mounts(options: ContainerOptions, paths: list[Path]) -> tuple[tuple[BindMount, ...], dict[str, str]]:
    """The bind mounts (weights and other files the argv names, the configured ones, the HF
    cache) and the variables they need set inside."""
    found = [m for m in (weights_mount(p) for p in paths) if m is not None]
    env: dict[str, str] = {}
    if options.hf_cache:
        home = Path(hf_constants.HF_HOME)
        home.mkdir(parents=True, exist_ok=True)
        found.append(BindMount(home, str(home), read_only=False))
        env["HF_HOME"] = str(home)
    found += [BindMount(m.source, m.target, m.read_only) for m in options.mounts]
    unique: dict[str, BindMount] = {}
    for mount in found:
        unique.setdefault(mount.target, mount)  # the first wins: the weights before the rest
    return tuple(unique.values()), env


def labels(model_id: str, port: int, persistent: bool) -> dict[str, str]:
    found = {LABEL_MODEL: model_id, LABEL_PORT: str(port)}
    if not persistent:
        pid = os.getpid()
        found[LABEL_OWNER] = f"{pid}:{create_time(pid) or 0.0}"
    return found


def container_spec(
    process: ProcessSpec, options: ContainerOptions, runtime: Runtime, paths: list[Path], *, persistent: bool
) -> ContainerSpec:
    """The container that runs what `process` would have run: its argv inside, its
    variables and key handed in by name, its port, health, timeouts and log file."""
    bind, mount_env = mounts(options, paths)
    login = options.login
    return ContainerSpec(
        name=process.name,
        container=options.name or default_name(process.name, process.port),
        runtime=runtime,
        image=options.image,
        argv=process.argv,
        port=process.port,
        host=process.host,
        health_path=process.health_path,
        mounts=bind,
        env={**mount_env, **process.env, **options.env},
        pass_env=process.pass_env,
        api_key=process.api_key,
        api_key_env=process.api_key_env,
        labels=labels(process.name, process.port, persistent),
        network=options.network,
        ipc=options.ipc,
        shm_size=options.shm_size,
        gpus=options.gpus,
        pull=options.pull,
        user=options.user,
        login=Login(login.registry, login.username, login.password_env) if login else None,
        run_args=tuple(options.run_args),
        start_timeout_s=process.start_timeout_s,
        stop_grace_s=process.stop_grace_s,
        log_file=process.log_file,
        log_lines=process.log_lines,
    )


def adopted_spec(process: ProcessSpec, options: ContainerOptions, runtime: Runtime, container: str) -> ContainerSpec:
    """What a later modelpool knows of a persistent container it adopts (it runs already)."""
    return ContainerSpec(
        name=process.name,
        container=container,
        runtime=runtime,
        image=options.image,
        argv=(),
        port=process.port,
        host=process.host,
        health_path=process.health_path,
        api_key=process.api_key,
        stop_grace_s=process.stop_grace_s,
        log_file=process.log_file,
        log_lines=process.log_lines,
    )
