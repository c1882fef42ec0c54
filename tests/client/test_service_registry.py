"""The SDK reads the services registry with its own small reader (it imports nothing of the
server side); the file is written by `services/registry.py`. On real files written by that
writer, the two must agree: the same live services with the same fields, the same dead or
reused-pid entries left out, the same lookup by id, name and `stack/name`, and the same
default directory."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelpool.client import services as client_services
from modelpool.client.errors import ConfigError
from modelpool.config.environment import default_state_dir
from modelpool.services.control import AmbiguousService, resolve
from modelpool.services.pids import create_time
from modelpool.services.registry import Registry, ServiceRecord


def _me() -> ServiceRecord:
    me = os.getpid()
    return ServiceRecord(id="agent:chat@9001", name="chat", kind="modelpool", pid=me, port=9001,
                         url="http://127.0.0.1:9001", started_at=create_time(me) or 0.0, stack="agent",
                         log_file="/tmp/chat.log", extra={"depends_on": ["speech"]})  # fmt: skip


def _finished_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(process.stdout)


def _fields(record: ServiceRecord | client_services.RunningService) -> tuple[object, ...]:
    return (record.id, record.name, record.url, record.pid, record.started_at, record.stack)


@pytest.mark.parametrize("stale", ["dead", "reused pid"])
def test_the_client_reads_the_live_services_the_registry_wrote(tmp_path: Path, stale: str) -> None:
    live = _me()
    other = dataclasses.replace(live, id="s:embed@9002", name="embed", port=9002, url="http://h:9002", stack=None)
    if stale == "dead":
        gone = dataclasses.replace(live, id="s:gone@9003", name="gone", pid=_finished_pid())
    else:
        gone = dataclasses.replace(live, id="s:reused@9004", name="reused", started_at=live.started_at - 100)
    registry = Registry(tmp_path)
    for record in (live, other, gone):  # the writer prunes stale entries on its next write: the stale one last
        registry.put(record)
    assert gone.id in (tmp_path / client_services.REGISTRY_FILE).read_text()
    read = client_services.running_services(tmp_path)  # before the registry reads (and prunes) the file
    assert sorted(map(_fields, read)) == sorted(map(_fields, registry.records()))
    assert sorted(map(_fields, read)) == sorted(map(_fields, (live, other)))


def test_lookups_agree_by_id_name_and_stack(tmp_path: Path) -> None:
    live = _me()
    registry = Registry(tmp_path)
    registry.put(live)
    read = client_services.running_services(tmp_path)
    for target in ("agent:chat@9001", "chat", "agent/chat", "nobody"):
        server_side, client_side = resolve(registry, target), client_services.resolve(read, target)
        assert (server_side and server_side.id) == (client_side and client_side.id), target
    registry.put(dataclasses.replace(live, id="other:chat@9005", url="http://h:9005", stack="other"))
    with pytest.raises(AmbiguousService) as server_refused:
        resolve(registry, "chat")
    with pytest.raises(ConfigError) as client_refused:
        client_services.resolve(client_services.running_services(tmp_path), "chat")
    assert client_refused.value.message == server_refused.value.message


def test_no_file_or_a_broken_one_is_no_services(tmp_path: Path) -> None:
    assert client_services.running_services(tmp_path / "missing") == []
    (tmp_path / client_services.REGISTRY_FILE).write_text("{not json")
    assert client_services.running_services(tmp_path) == []
    assert Registry(tmp_path).path == tmp_path / client_services.REGISTRY_FILE


def test_the_default_directory_is_the_registrys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(client_services.STATE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert client_services.default_state_dir() == default_state_dir() == tmp_path / "xdg" / "modelpool"
    monkeypatch.setenv(client_services.STATE_DIR_ENV, str(tmp_path / "explicit"))
    assert client_services.default_state_dir() == default_state_dir() == tmp_path / "explicit"
