"""What the engine-container tests share: the engine image (built once a session), models
configured to run in it, and what the container runtime itself says about their containers
(the runtime is the witness: a test never takes modelpool's word that a container runs)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.containers.host import ContainerHost
from tests.e2e.conftest import smollm2_gguf

PREFIX = "modelpool-test-engine-e2e"
"""Every image these tests build and every model id (so container name) starts with it."""
MODEL_LABEL = "io.modelpool.model"


@dataclass(frozen=True)
class EngineImage:
    tag: str
    build_s: float
    size_bytes: int


def build_engine_image(host: ContainerHost, context: Path) -> EngineImage:
    """Build tests/containers/engine_image in `context` (see `ContainerHost.build_engine_image`)."""
    tag = f"localhost/{PREFIX}-llama:{os.getpid()}"  # a session's own: parallel sessions never share one
    seconds = host.build_engine_image(tag, context)
    return EngineImage(tag, seconds, host.image_bytes(tag))


def engine_model(host: ContainerHost, image: EngineImage, *, options: Mapping[str, Any] = {},
                 container: Mapping[str, Any] = {}, **settings: Any) -> dict[str, Any]:  # fmt: skip
    """A `llama_server` model on the starter GGUF (bind-mounted by modelpool at its host path)
    whose engine runs in `image`: llama_cpp.server, started as `python3 -m llama_cpp.server`."""
    return {
        "backend": "llama_server",
        "source": str(smollm2_gguf()),
        "preload": False,  # loaded by the test, which times it
        "restart_backoff_s": 0.2,
        "options": {
            "context_length": 2048,
            "stop_grace_s": 5,
            "container": {"image": image.tag, "runtime": host.cli, **container},
            **options,
        },
        **settings,
    }


def write_config(directory: Path, models: Mapping[str, Mapping[str, Any]]) -> Path:
    config = {"starter_models": False, "state_dir": str(directory / "state"), "enabled_models": list(models),
              "models": dict(models)}  # fmt: skip
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    labels: dict[str, str]
    env: list[str]
    command_line: list[str]
    """The `run` command line as Podman records it (`CreateCommand`); Docker records none, so
    there the entrypoint and its arguments."""


def containers(host: ContainerHost, model_id: str, *, every: bool = False) -> list[Container]:
    """The containers labelled with `model_id`: the running ones, or with `every` stopped ones too."""
    every_flag = ["-a"] if every else []
    listed = host.run("ps", *every_flag, "-q", "--no-trunc", "--filter", f"label={MODEL_LABEL}={model_id}")
    ids = listed.stdout.split()
    if not ids:
        return []
    inspected = host.run("inspect", "--type", "container", *ids, check=False)
    return [_container(record) for record in json.loads(inspected.stdout or "[]")]


def _container(record: dict[str, Any]) -> Container:
    config = record.get("Config") or {}
    return Container(
        id=record["Id"],
        name=record["Name"].lstrip("/"),
        labels=dict(config.get("Labels") or {}),
        env=list(config.get("Env") or []),
        command_line=list(config.get("CreateCommand") or [record.get("Path", ""), *(record.get("Args") or [])]),
    )


def env_value(container: Container, name: str) -> str | None:
    for entry in container.env:
        key, _, value = entry.partition("=")
        if key == name:
            return value
    return None


def remove_containers(host: ContainerHost, model_id: str) -> None:
    """Remove this test's containers, running or not (persistent ones outlive modelpool by design)."""
    for container in containers(host, model_id, every=True):
        host.remove_container(container.id)
