"""The launcher in process: progress while a slow service starts, dependencies started
first with their addresses filled in, and stop_started undoing what it started."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from modelpool.services.launcher import STARTED, Launcher
from modelpool.services.pids import is_alive
from modelpool.services.ports import free_port
from modelpool.services.registry import Registry
from modelpool.services.stack import load_stack

SLOW_SERVER = "import sys, time, http.server as h; time.sleep(1.5); print('peer', sys.argv[2], flush=True); " \
    "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), h.SimpleHTTPRequestHandler).serve_forever()"  # fmt: skip


async def test_a_slow_service_is_reported_while_it_starts_and_gets_its_dependency_url(tmp_path: Path) -> None:
    path = tmp_path / "stack.yaml"
    quick = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    slow = [sys.executable, "-c", SLOW_SERVER, "{port}", "{base.url}"]
    services = {"base": {"command": quick, "health_path": "/"},
                "slow": {"command": slow, "health_path": "/", "depends_on": ["base"]}}  # fmt: skip
    path.write_text(yaml.safe_dump({"name": "t", "port_base": free_port(), "services": services}))
    events: list[tuple[str, str]] = []
    registry = Registry(tmp_path / "state")
    launcher = Launcher(load_stack(path), registry, detach=True, on_event=lambda n, m: events.append((n, m)),
                        progress_every_s=0.4)  # fmt: skip
    try:
        outcomes = await launcher.up()
        assert [(o.service.name, o.state) for o in outcomes] == [("base", STARTED), ("slow", STARTED)]
        base, slow_record = (o.record for o in outcomes)
        assert base is not None and slow_record is not None
        waiting = [m for n, m in events if n == "slow" and m.startswith("waiting for")]
        assert waiting and f"{slow_record.url}/" in waiting[0]
        assert f"peer {base.url}" in Path(slow_record.log_file or "").read_text()
        assert {r.id for r in registry.records()} == {base.id, slow_record.id}
    finally:
        stopped = await launcher.stop_started()
    assert stopped == ["slow", "base"]  # dependents first
    assert registry.records() == [] and not is_alive(slow_record.pid)
