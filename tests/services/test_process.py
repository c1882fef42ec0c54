"""ManagedProcess with real child processes (small Python HTTP servers on loopback)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from modelpool.services.ports import free_port, port_in_use
from modelpool.services.process import ManagedProcess, ProcessFailed, ProcessSpec, terminate_group

SERVER = """
import http.server, os, signal, sys
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("child env:", os.environ.get("CHILD_FLAG"), os.environ.get("LD_LIBRARY_PATH", "").split(":")[0], flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        print("request", self.path, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def spec(tmp_path: Path, *extra: str, **fields: Any) -> ProcessSpec:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    defaults: dict[str, Any] = {"start_timeout_s": 30, "stop_grace_s": 5, "log_file": tmp_path / "child.log"}
    return ProcessSpec(
        name="child", argv=(sys.executable, str(script), "{port}", *extra), port=free_port(), **{**defaults, **fields}
    )


async def test_start_waits_for_health_captures_output_and_stops(tmp_path: Path) -> None:
    child = ManagedProcess(spec(tmp_path, env={"CHILD_FLAG": "on"}, library_path=("/opt/engine/lib",)))
    await child.start()
    assert child.running and port_in_use(child.spec.port)
    assert "child env: on /opt/engine/lib" in child.last_lines()
    assert "request /health" in child.last_lines()
    assert await child.stop() == -signal.SIGTERM
    assert not port_in_use(child.spec.port)
    assert "child env: on" in (tmp_path / "child.log").read_text()


async def test_stop_escalates_to_sigkill_for_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    child = ManagedProcess(spec(tmp_path, "--ignore-term", stop_grace_s=0.5))
    await child.start()
    assert await child.stop() == -signal.SIGKILL


async def test_a_process_that_exits_while_starting_is_reported_with_its_output(tmp_path: Path) -> None:
    broken = ProcessSpec(
        name="broken",
        port=free_port(),
        start_timeout_s=30,
        argv=(sys.executable, "-c", "print('missing weights: /x.gguf'); raise SystemExit(3)"),
    )
    with pytest.raises(ProcessFailed) as caught:
        await ManagedProcess(broken).start()
    assert "exited with code 3" in caught.value.message and "missing weights" in caught.value.message


async def test_a_process_that_never_gets_healthy_times_out_and_is_stopped(tmp_path: Path) -> None:
    child = ManagedProcess(spec(tmp_path, health_path="/not-here", start_timeout_s=1.5))
    with pytest.raises(ProcessFailed, match="was not healthy"):
        await child.start()
    assert not child.running


async def test_a_crash_is_noticed_with_its_exit_code(tmp_path: Path) -> None:
    exits: list[int | None] = []
    noticed = asyncio.Event()

    def on_exit(code: int | None) -> None:
        exits.append(code)
        noticed.set()

    child = ManagedProcess(spec(tmp_path), on_exit=on_exit)
    await child.start()
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    await asyncio.wait_for(noticed.wait(), 10)
    assert exits == [-signal.SIGKILL] and not child.running
    await child.stop()  # stopping a dead process is fine


async def test_a_persistent_child_writes_to_its_file_and_is_adopted_then_killed_when_deaf(tmp_path: Path) -> None:
    first = ManagedProcess(spec(tmp_path, "--ignore-term", output_to_file=True, stop_grace_s=0.5))
    await first.start()
    assert first.pid is not None and "child env:" in first.last_lines()  # read back from the log file
    await first.detach()  # the launcher goes away; the process stays
    assert first.running

    exits: list[int | None] = []
    adopter = ManagedProcess(first.spec, on_exit=exits.append)
    adopter.adopt(first.pid)
    assert adopter.running and await adopter.check_health()
    assert await adopter.stop() is None  # SIGTERM ignored → SIGKILL; only the parent learns the code
    assert not adopter.running and exits == []  # asked to stop: not a crash
    assert await terminate_group(first.pid, 0.5) == "gone"


async def test_terminate_group_escalates_to_sigkill(tmp_path: Path) -> None:
    deaf = ManagedProcess(spec(tmp_path, "--ignore-term"))
    await deaf.start()
    assert deaf.pid is not None
    assert await terminate_group(deaf.pid, 0.5) == "killed"
    await deaf.stop()


def test_an_engine_gets_the_allowlist_its_env_and_its_key_and_a_stack_service_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outside = {"MP_KEY": "sk-secret", "VLLM_API_KEY": "sk-other", "HOST": "0.0.0.0", "HF_TOKEN": "hf-x",
               "CUDA_VISIBLE_DEVICES": "1", "LC_ALL": "C.UTF-8", "VLLM_CPU_KVCACHE_SPACE": "2"}  # fmt: skip
    for name, value in outside.items():
        monkeypatch.setenv(name, value)
    engine = ProcessSpec(name="e", argv=("x",), port=1, env={"FLAG": "on"}, pass_env=("HF_TOKEN",),
                         api_key="k" * 43, api_key_env="API_KEY", library_path=("/opt/lib",))  # fmt: skip
    environment = engine.environment()
    assert {"MP_KEY", "VLLM_API_KEY", "HOST"}.isdisjoint(environment)
    assert {k: environment[k] for k in ("CUDA_VISIBLE_DEVICES", "LC_ALL", "VLLM_CPU_KVCACHE_SPACE", "HF_TOKEN")} == {
        "CUDA_VISIBLE_DEVICES": "1", "LC_ALL": "C.UTF-8", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_TOKEN": "hf-x",
    }  # fmt: skip
    assert environment["FLAG"] == "on" and environment["API_KEY"] == "k" * 43
    assert environment["PATH"] == os.environ["PATH"]
    assert environment["LD_LIBRARY_PATH"].split(os.pathsep)[0] == "/opt/lib"
    assert "k" * 43 not in repr(engine) and "FLAG" not in repr(engine)  # specs get logged; keys must not
    service = ProcessSpec(name="s", argv=("x",), port=1, inherit_env=True)
    assert service.environment()["MP_KEY"] == "sk-secret"  # the operator's own command (a modelpool reads its keys)


async def test_an_engine_that_cannot_be_run_says_so_through_the_parent_death_wrapper(tmp_path: Path) -> None:
    missing = ProcessSpec(name="missing", argv=(str(tmp_path / "no-such-engine"),), port=free_port(),
                          start_timeout_s=30, die_with_parent=True)  # fmt: skip
    with pytest.raises(ProcessFailed, match=r"cannot run .*no-such-engine: No such file or directory"):
        await ManagedProcess(missing).start()
