"""Item 7 of issue 27: engines are contained.

An engine process used to inherit modelpool's whole environment (the variables its API
keys and upstream keys are read from included), to live on as an orphan holding its port
when modelpool was killed (twice, after the OOM killer ended the server), and to answer
anyone on its loopback port, around modelpool's keys and limits. Each test replays that
with a real engine (llama-cpp-python's server on SmolLM2) or a real `modelpool serve`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from modelpool.services.pids import create_time, is_alive
from modelpool.services.process import terminate_group
from modelpool.services.reaper import OWNED_ENGINE_KIND, owned_engines
from modelpool.services.registry import Registry, ServiceRecord
from tests.conftest import sdk, serving
from tests.e2e.test_managed_engines import ENGINE, HI, engine_config, loaded
from tests.polling import wait_until
from tests.processes import modelpool_serve

ADMIN_KEY = "sk-modelpool-admin-5d1c-never-in-an-engine"
UPSTREAM_KEY = "sk-upstream-93ab-never-in-an-engine"


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def contained_config(tmp_path: Path) -> dict[str, Any]:
    config = engine_config(tmp_path, options={"env": {"ENGINE_FLAG": "on"}})
    upstream = {"backend": "openai_remote", "preload": False,
                "options": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "MP_UPSTREAM_KEY"}}  # fmt: skip
    config["models"] = {**config["models"], "upstream": upstream}
    config["enabled_models"] = [ENGINE, "upstream"]
    config["auth"] = {"keys": [{"name": "admin", "scopes": ["admin", "inference"], "key_env": "MP_ADMIN_KEY"}]}
    return config


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
async def test_an_engine_gets_an_allowlisted_environment_and_refuses_callers_without_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MP_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("MP_UPSTREAM_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("HOST", "0.0.0.0")  # llama_cpp.server binds where $HOST says, whatever --host says
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # thread settings do reach it
    caplog.set_level(logging.DEBUG)
    async with serving(contained_config(tmp_path)) as (_, client):
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        engine = (await loaded(client))["replicas"][0]
        environ = environ_of(engine["pid"])
        assert not [name for name, value in environ.items() if ADMIN_KEY in value or UPSTREAM_KEY in value]
        assert {"MP_ADMIN_KEY", "MP_UPSTREAM_KEY", "HOST"}.isdisjoint(environ)
        assert environ["ENGINE_FLAG"] == "on" and environ["OMP_NUM_THREADS"] == "2"
        assert environ["PATH"] == os.environ["PATH"]
        process = psutil.Process(engine["pid"])
        listening = {c.laddr.ip for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert listening == {"127.0.0.1"}

        key = environ["API_KEY"]  # the engine's own, random, from its environment
        assert len(key) >= 32 and key not in " ".join(process.cmdline())  # `ps` shows argv to everyone
        body = {"model": ENGINE, "messages": HI, "max_tokens": 2}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{engine['port']}", timeout=60) as direct:
            assert (await direct.get("/v1/models")).status_code == 401
            assert (await direct.post("/v1/chat/completions", json=body)).status_code == 401
            wrong = {"Authorization": f"Bearer {ADMIN_KEY}"}  # modelpool's key is not the engine's
            assert (await direct.post("/v1/chat/completions", json=body, headers=wrong)).status_code == 401
        reply = await sdk(client, ADMIN_KEY).chat.completions.create(model=ENGINE, messages=HI, max_tokens=2)
        assert reply.usage is not None and reply.usage.completion_tokens > 0  # modelpool's calls carry the key
        assert (await client.post(f"/v1/admin/models/{ENGINE}/unload")).json()["state"] == "unloaded"
        shown = (await client.get(f"/v1/admin/models/{ENGINE}/status")).text
        shown += (await client.get(f"/v1/admin/models/{ENGINE}/logs", params={"lines": 500})).text
    assert key not in shown and key not in caplog.text
    assert owned_engines(tmp_path).records() == []  # unloaded: its record went with it


@pytest.fixture
def engines_stopped() -> Iterator[list[int]]:
    """Pids of engines a test made: stopped afterwards, whatever the test found."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if is_alive(pid):
            asyncio.run(terminate_group(pid, 5))


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_an_engine_dies_with_a_modelpool_killed_by_sigkill(tmp_path: Path, engines_stopped: list[int]) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({"starter_models": False, **engine_config(tmp_path)}))
    with modelpool_serve(tmp_path / "server.log", "-c", str(config_file)) as server:
        replicas = httpx.get(f"{server.url}/v1/admin/models/{ENGINE}/status", timeout=60).json()["replicas"]
        pid = replicas[0]["pid"]
        engines_stopped.append(pid)
        [record] = owned_engines(tmp_path).records()  # recorded, with its owner, while it runs
        assert (record.pid, record.extra["owner_pid"]) == (pid, server.process.pid)
        server.process.kill()  # as the OOM killer does: no shutdown code runs
        server.process.wait()
        wait_until(lambda: not is_alive(pid), "the engine to die with its modelpool", timeout_s=30)


SLEEPER = """
import signal, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def sleepers(count: int, *flags: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that stand in for engines (each in its own session, as engines are)."""
    argv = [sys.executable, "-c", SLEEPER, *flags]
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True) for _ in range(count)]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


def owned(process: subprocess.Popen[bytes], name: str, owner: tuple[int, float], started_at: float) -> ServiceRecord:
    extra = {"owner_pid": owner[0], "owner_started_at": owner[1], "stop_grace_s": 1.0}
    return ServiceRecord(f"engine:{name}", name, OWNED_ENGINE_KIND, process.pid, 0, "", started_at, extra=extra)


def dead_owner() -> tuple[int, float]:
    """A modelpool that is gone: a process that ran, recorded as pid and creation time."""
    process = subprocess.Popen(["sleep", "600"])
    started_at = create_time(process.pid)
    process.kill()
    process.wait()
    assert started_at is not None
    return process.pid, started_at


def test_a_starting_modelpool_stops_engines_a_dead_one_left_and_nothing_else(tmp_path: Path) -> None:
    registry = owned_engines(tmp_path)
    gone = dead_owner()
    me = (os.getpid(), create_time(os.getpid()) or 0.0)
    with sleepers(1, "--ignore-term") as [leftover], sleepers(2) as [reused, kept]:
        registry.put(owned(leftover, "leftover", gone, create_time(leftover.pid) or 0.0))  # deaf to SIGTERM, too
        # Its pid now names another process (creation time differs): never signalled.
        registry.put(owned(reused, "reused", gone, (create_time(reused.pid) or 0.0) - 100))
        registry.put(owned(kept, "kept", me, create_time(kept.pid) or 0.0))  # its modelpool lives
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump({"starter_models": False, "state_dir": str(tmp_path)}))
        with modelpool_serve(tmp_path / "server.log", "-c", str(config_file)) as server:
            assert leftover.wait(timeout=30) == -signal.SIGKILL  # stopped before the server was ready
            assert reused.poll() is None and kept.poll() is None
            assert "stopping an engine a modelpool that is gone left running" in server.log_text()
        assert [r.name for r in registry.records()] == ["kept"]


async def test_a_persistent_engines_key_stays_private_and_outlives_the_modelpool_that_made_it(
    tmp_path: Path, engines_stopped: list[int]
) -> None:
    async with serving(engine_config(tmp_path, options={"persistent": True})) as (_, client):
        engine = (await loaded(client))["replicas"][0]
        engines_stopped.append(engine["pid"])
    registry = Registry(tmp_path)
    [record] = registry.records()  # modelpool stopped; its persistent engine did not
    key = registry.key(record.id)
    assert key is not None and environ_of(engine["pid"])["API_KEY"] == key
    [key_file] = (tmp_path / "keys").iterdir()  # beside the registry, for the next modelpool
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert key not in (tmp_path / "services.json").read_text()
    assert httpx.get(f"{record.url}/v1/models", timeout=30).status_code == 401  # still closed to others

    status = [sys.executable, "-m", "modelpool", "status", "--stacks", "--json", "--state-dir", str(tmp_path)]
    shown = subprocess.run(status, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and key not in shown.stdout
    assert [e["healthy"] for e in json.loads(shown.stdout)] == [True]  # asked with the engine's key
    async with serving(engine_config(tmp_path, options={"persistent": True})) as (_, client):
        adopted = (await loaded(client))["replicas"][0]
        assert adopted["pid"] == engine["pid"]
        reply = await sdk(client).chat.completions.create(model=ENGINE, messages=HI, max_tokens=2)
        assert reply.usage is not None and reply.usage.completion_tokens > 0  # the next modelpool has its key
