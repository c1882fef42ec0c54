"""A managed backend with `options.container`, against real containers: the weights mounted
read-only at the same path, the key handed in by name, the owned-engines record and the
reaper, crash supervision, and a persistent container left running, adopted by the next
backend and stopped by `modelpool stop-persistent`. The engine is the Perl HTTP server of
test_containers_live in the local base image (a llama_server backend whose argv is that
server: everything but the argv is the backend's own)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from modelpool.backends.context import BackendContext
from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
from modelpool.config.schema import ModelConfig
from modelpool.config.sources import HubLocation
from modelpool.services.container_argv import LABEL_MODEL, LABEL_OWNER, Runtime
from modelpool.services.container_cli import inspect
from modelpool.services.ports import free_port
from modelpool.services.reaper import owned_engines, reap_orphaned_engines
from modelpool.services.registry import ENGINE_KIND, Registry
from tests.containers.host import REPO, ContainerHost
from tests.polling import until
from tests.services.test_containers_live import SERVER

PREFIX = "modelpool-test-engines-backend-"
WEIGHTS_CHECK = (
    'print "weights ", (!-r $ARGV[1] ? "not mounted" : open(my $w, ">>", $ARGV[1]) ? "writable" : "read-only"), "\\n"; '
)


class PerlEngine(LlamaServerBackend):
    """llama_server's options, records and supervision; the Perl server as its engine."""

    def command(self, weights: Path) -> list[str]:
        return ["perl", "-e", WEIGHTS_CHECK + SERVER.replace("ENGINE_KEY", "LLAMA_API_KEY"), "{port}", str(weights)]


@pytest.fixture
def host(container_host: ContainerHost) -> ContainerHost:
    return container_host


def engine(host: ContainerHost, tmp_path: Path, name: str, **options: Any) -> PerlEngine:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF" + bytes(64))
    model = ModelConfig(id="perl", backend="llama_server", source=str(weights))
    container = {"image": host.base_image, "runtime": host.cli, "name": name, "pull": "never"}
    parsed = LlamaServerOptions.model_validate(
        {"binary": "perl", "stop_grace_s": 3, "start_timeout_s": 60, "container": container, **options}
    )
    return PerlEngine(model, parsed, BackendContext(hub=HubLocation(state_dir=tmp_path / "state")))


async def test_owned_container_is_recorded_supervised_and_reaped(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "owned")
    backend = engine(host, tmp_path, names[0])
    crashes: list[str] = []
    backend.supervise(crashes.append)
    await backend.start()
    try:
        await backend.check_health()  # with the key it gave the engine
        assert backend.pid is not None and backend.resident_bytes() > 0
        await until(lambda: any("weights read-only" in line for line in backend.log_tail(20)), "the weights check")
        state = await inspect(runtime, names[0])
        assert state is not None and state.labels[LABEL_MODEL] == "perl"
        assert state.labels[LABEL_OWNER].startswith(f"{os.getpid()}:")
        [record] = owned_engines(tmp_path / "state").records()
        assert record.pid == backend.pid and record.extra["container"] == names[0]
        host.run("kill", "-s", "KILL", names[0])  # from outside: the supervisor is told
        await until(lambda: bool(crashes), "the crash report", timeout_s=30)
        assert "engine container of 'perl'" in crashes[0]
    finally:
        await backend.stop()
    assert owned_engines(tmp_path / "state").records() == []


async def test_after_a_crash_the_same_name_and_port_start_again(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "restart")
    backend = engine(host, tmp_path, names[0], port=free_port())
    crashes: list[str] = []
    backend.supervise(crashes.append)
    await backend.start()
    first = backend.pid
    host.run("kill", "-s", "KILL", names[0])
    await until(lambda: bool(crashes), "the crash report", timeout_s=30)
    await backend.stop()  # what the supervisor does before it starts the model again
    await backend.start()
    try:
        await backend.check_health()
        assert backend.pid != first
    finally:
        await backend.stop()


async def test_reaper_stops_a_container_whose_owner_is_gone(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "orphan")
    backend = engine(host, tmp_path, names[0])
    await backend.start()
    registry = owned_engines(tmp_path / "state")
    [record] = registry.records()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    registry.put(replace(record, extra={**record.extra, "owner_pid": dead.pid, "owner_started_at": 1.0}))
    reaped = await reap_orphaned_engines(tmp_path / "state")
    assert [r.id for r in reaped] == [record.id]
    assert await inspect(runtime, names[0]) is None
    await backend.stop()  # already gone: nothing to do, no error


async def test_persistent_container_is_left_adopted_and_stopped_by_the_cli(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "persistent")
    first = engine(host, tmp_path, names[0], persistent=True)
    await first.start()
    await first.detach()
    state = await inspect(runtime, names[0])
    assert state is not None and state.running and LABEL_OWNER not in state.labels
    [record] = Registry(tmp_path / "state").find(kind=ENGINE_KIND)
    assert record.extra["container"] == names[0]

    second = engine(host, tmp_path, names[0], persistent=True)
    await second.start()  # adopts: no second container (the name would clash)
    assert second.pid == first.pid
    await second.check_health()  # with the saved key
    await second.detach()

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "modelpool", "stop-persistent", "--grace", "3", "--state-dir", str(tmp_path / "state")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "healthy\tterminated" in done.stdout
    assert await inspect(runtime, names[0]) is None
