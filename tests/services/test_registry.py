"""The registry of long-lived processes: atomic, locked, and pruned of the dead."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from modelpool.services.pids import create_time
from modelpool.services.registry import Registry, ServiceRecord, default_state_dir


def record(name: str, pid: int, started_at: float | None = None, **fields: object) -> ServiceRecord:
    started = create_time(pid) if started_at is None else started_at
    return ServiceRecord(id=f"engine:{name}", name=name, kind="engine", pid=pid, port=8100, url="http://127.0.0.1:8100",
                         started_at=started or 0.0, **fields)  # type: ignore[arg-type]  # fmt: skip


def test_records_of_dead_or_reused_pids_are_pruned(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    registry = Registry(tmp_path)
    try:
        registry.put(record("alive", child.pid))
        registry.put(record("reused", child.pid, started_at=time.time() - 3600))  # same pid, another process
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        registry.put(record("dead", dead.pid))
        assert [r.name for r in registry.records()] == ["alive"]
        assert '"reused"' not in registry.path.read_text()  # pruned from the file too
        assert registry.find(kind="engine", name="alive")[0].pid == child.pid
        registry.remove("engine:alive")
        assert registry.records() == []
    finally:
        child.kill()
        child.wait()


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: Registry(tmp_path).put(record(f"s{i}", child.pid)), range(40)))
        assert len(Registry(tmp_path).records()) == 40
    finally:
        child.kill()
        child.wait()


def test_the_state_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODELPOOL_STATE_DIR", str(tmp_path / "explicit"))
    assert default_state_dir() == tmp_path / "explicit"
    monkeypatch.delenv("MODELPOOL_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "modelpool"
