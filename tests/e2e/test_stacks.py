"""`modelpool up/status/logs/down` with real processes: a stack of two modelpool servers
(an LLM and speech), reuse, persistence past a killed launcher, ambiguous names, ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from modelpool.services.pids import create_time, is_alive
from modelpool.services.ports import free_port, port_is_free
from modelpool.services.registry import Registry, ServiceRecord
from tests.conftest import CHAT_MODEL, TTS_MODEL
from tests.stacks import UP_TIMEOUT_S, by_name, cli, wait_until, write_agent_stack


def http_server_stack(directory: Path, services: dict[str, dict[str, object]], port_base: int) -> Path:
    """A stack of `python -m http.server` services (cheap, real processes)."""
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"]
    full = {name: {"command": command, "health_path": "/", **extra} for name, extra in services.items()}
    path = directory / "stack.yaml"
    path.write_text(yaml.safe_dump({"port_base": port_base, "services": full}))
    return path


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A private registry; whatever a test leaves running is stopped afterwards."""
    state = tmp_path / "state"
    yield state
    cli(state, "down", "--all", "--grace", "5")


def test_agent_stack_up_reuse_persistence_status_logs_down(tmp_path: Path, state_dir: Path) -> None:
    stack = write_agent_stack(tmp_path / "agent", port_base=free_port())
    # A foreground `up`: starts both, then watches them.
    with (tmp_path / "up.out").open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "modelpool", "up", str(stack), "--state-dir", str(state_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "Watching 2 service(s)" in (tmp_path / "up.out").read_text(), UP_TIMEOUT_S, "the stack")
        output = (tmp_path / "up.out").read_text()
        first = by_name(state_dir)
        assert set(first) == {"llm", "speech"}, output
        assert "started" in output and "except the persistent ones (llm)" in output
        for record in first.values():  # both ready: /readyz answers once the preloaded models are in
            assert httpx.get(record.url + "/readyz", timeout=5).status_code == 200
        models = httpx.get(first["llm"].url + "/v1/models", timeout=5).json()["data"]
        assert CHAT_MODEL in {m["id"] for m in models} and TTS_MODEL not in {m["id"] for m in models}  # llm.yaml
        # The launcher dies without a chance to clean up: the persistent llm lives on.
        launcher.kill()
        launcher.wait()
        wait_until(lambda: not is_alive(first["speech"].pid), 30, "the non-persistent speech service to stop")
        assert is_alive(first["llm"].pid, first["llm"].started_at)
    finally:
        if launcher.poll() is None:
            launcher.kill()

    second = cli(state_dir, "up", str(stack), "--detach")
    assert second.returncode == 0, second.stdout + second.stderr
    again = by_name(state_dir)
    assert again["llm"].pid == first["llm"].pid  # reused, not started twice
    assert again["speech"].pid != first["speech"].pid
    assert "llm: already running" in second.stdout and "speech: starting" in second.stdout

    third = cli(state_dir, "up", str(stack), "--detach")
    assert third.returncode == 0 and third.stdout.count("│ reused") == 2 and "starting" not in third.stdout
    assert by_name(state_dir) == again

    status = cli(state_dir, "status", "--stacks")
    assert status.returncode == 0
    for record in again.values():
        row = next(line for line in status.stdout.splitlines() if record.id in line)
        assert record.url in row and str(record.pid) in row and "healthy" in row
    assert cli(state_dir, "ps", "--services").stdout == status.stdout
    entries = json.loads(cli(state_dir, "status", "--stacks", "--json").stdout)
    assert {(e["id"], e["pid"], e["url"], e["healthy"]) for e in entries} == {
        (r.id, r.pid, r.url, True) for r in again.values()
    }

    logs = cli(state_dir, "logs", "speech", "-n", "200")
    assert logs.returncode == 0 and "starting modelpool" in logs.stdout

    # Follow the llm's log while `down` stops it: -f ends when the process does.
    follower = subprocess.Popen(
        [sys.executable, "-m", "modelpool", "logs", "llm", "-f", "-n", "0", "--state-dir", str(state_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    down = cli(state_dir, "down", "--stack", str(stack))
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.count("terminated") == 2
    assert down.stdout.index("agent/speech") < down.stdout.index("agent/llm")  # newest first
    followed, _ = follower.communicate(timeout=30)
    assert "models unloaded" in followed and "Finished server process" in followed, followed  # a graceful stop
    assert Registry(state_dir).records() == []
    assert not any(is_alive(r.pid) for r in again.values())
    assert "not running" in cli(state_dir, "down", "llm").stdout  # skipped, not an error
    bare = subprocess.run([sys.executable, "-m", "modelpool", "down", "--state-dir", str(state_dir)],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert bare.returncode == 2 and "name services, or use --all or --stack FILE" in bare.stdout


def test_a_name_two_running_services_share_is_refused(tmp_path: Path, state_dir: Path) -> None:
    for stack_name in ("one", "two"):
        path = http_server_stack(tmp_path / stack_name, {"web": {}}, free_port())
        assert cli(state_dir, "up", str(path), "-d").returncode == 0
    assert "changed" not in cli(state_dir, "up", str(path), "-d").stdout
    (tmp_path / "two" / "web.yaml").write_text("a config file appears\n")  # discovered: the definition changed
    assert "changed since it started" in cli(state_dir, "up", str(path), "-d").stdout
    records = Registry(state_dir).records()
    assert sorted(r.id.split("@")[0] for r in records) == ["one/web", "two/web"]

    for command in (["logs", "web"], ["down", "web"]):
        refused = cli(state_dir, *command)
        assert refused.returncode == 2
        assert "2 running services are called 'web'" in refused.stdout
        assert all(r.id in refused.stdout and r.url in refused.stdout for r in records)
    assert len(Registry(state_dir).records()) == 2  # nothing was stopped

    stopped = cli(state_dir, "down", "one/web")  # stack/name picks one
    assert stopped.returncode == 0 and "terminated" in stopped.stdout
    assert [r.id.split("@")[0] for r in Registry(state_dir).records()] == ["two/web"]


def test_auto_ports_go_around_taken_and_registered_ports_and_a_busy_explicit_port_is_an_error(
    tmp_path: Path, state_dir: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        base = taken.getsockname()[1]
        # A registered service (this test process stands in for it) holds base+1 though nothing listens.
        me = os.getpid()
        Registry(state_dir).put(
            ServiceRecord(id=f"x/held@{base + 1}", name="held", kind="command", pid=me, port=base + 1,
                          url=f"http://127.0.0.1:{base + 1}", started_at=create_time(me) or 0.0)
        )  # fmt: skip
        path = http_server_stack(tmp_path / "ports", {"a": {}, "b": {}}, base)
        expected = [p for p in range(base + 2, base + 40) if port_is_free(p)][:2]
        result = cli(state_dir, "up", str(path), "-d")
        assert result.returncode == 0, result.stdout
        assert sorted(r.port for r in Registry(state_dir).records() if r.name in ("a", "b")) == expected

        busy = http_server_stack(tmp_path / "busy", {"c": {"port": base}}, base)
        refused = cli(state_dir, "up", str(busy), "-d")
        assert refused.returncode == 1
        assert f"port {base} on 127.0.0.1 is busy" in refused.stdout

        held = http_server_stack(tmp_path / "held", {"d": {"port": base + 1}}, base)
        refused = cli(state_dir, "up", str(held), "-d")
        assert refused.returncode == 1 and f"port {base + 1} is taken by service x/held@{base + 1}" in refused.stdout
    Registry(state_dir).remove(f"x/held@{base + 1}")


def test_a_service_that_fails_to_start_is_reported_and_its_dependents_skipped(tmp_path: Path, state_dir: Path) -> None:
    path = tmp_path / "stack.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "port_base": free_port(),
                "services": {
                    "broken": {"command": [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]},
                    "app": {"command": [sys.executable, "-m", "http.server", "{port}"], "depends_on": ["broken"]},
                },
            }
        )
    )
    result = cli(state_dir, "up", str(path))
    assert result.returncode == 1
    assert "exited with code 3" in result.stdout and "no model here" in result.stdout
    assert "skipped" in result.stdout
    assert Registry(state_dir).records() == []
    assert "no model here" in cli(state_dir, "logs", "broken").stdout  # its log outlives it


def test_ctrl_c_stops_what_the_foreground_up_started(tmp_path: Path, state_dir: Path) -> None:
    path = http_server_stack(tmp_path / "fg", {"web": {}, "keep": {"persistent": True}}, free_port())
    with (tmp_path / "up.out").open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "modelpool", "up", str(path), "--state-dir", str(state_dir)], stdout=out
        )
    wait_until(lambda: "Watching" in (tmp_path / "up.out").read_text(), 60, "the stack")
    web = by_name(state_dir)["web"]
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) == 0
    assert "stopped web; left running keep" in (tmp_path / "up.out").read_text()
    assert not is_alive(web.pid) and set(by_name(state_dir)) == {"keep"}


def test_the_foreground_up_reports_a_crash_and_a_down_and_ends_when_all_it_started_is_gone(
    tmp_path: Path, state_dir: Path
) -> None:
    path = http_server_stack(tmp_path / "fg", {"web": {}, "api": {}}, free_port())
    with (tmp_path / "up.out").open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "modelpool", "up", str(path), "--state-dir", str(state_dir)], stdout=out
        )
    wait_until(lambda: "Watching" in (tmp_path / "up.out").read_text(), 60, "the stack")
    assert cli(state_dir, "down", "web").returncode == 0  # stopped from outside: not a crash
    os.kill(by_name(state_dir)["api"].pid, signal.SIGKILL)  # a crash
    assert launcher.wait(timeout=60) == 1
    output = (tmp_path / "up.out").read_text()
    assert "web: stopped (exit code -15)" in output and "api: exited unexpectedly (code -9)" in output
    assert "Every service this launcher started has exited." in output
