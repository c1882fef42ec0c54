"""ContainerProcess with real containers: a tiny HTTP server in Perl (the local Debian base
image has perl-base and nothing else to serve with), run through Podman (or Docker) as an
engine would be. No image is built: the base image runs with `perl` as its entrypoint."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from modelpool.services.container_argv import LABEL_MODEL, ContainerSpec, Runtime
from modelpool.services.container_cli import inspect, stop_container
from modelpool.services.containers import ContainerProcess
from modelpool.services.ports import free_port
from modelpool.services.process import ProcessFailed, answers_health
from tests.containers.host import ContainerHost
from tests.polling import until, until_answered

SERVER = r"""
use IO::Socket::INET; $| = 1;
if ($ENV{IGNORE_TERM}) { $SIG{TERM} = 'IGNORE' } else { $SIG{TERM} = sub { print "terminated\n"; exit 0 } }
my $server = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $ARGV[0], Listen => 16, ReuseAddr => 1)
    or die "cannot listen: $!";
print "listening on $ARGV[0] with key ", ($ENV{ENGINE_KEY} ? "set" : "unset"), " flag=$ENV{ENGINE_FLAG}\n";
while (1) {
    my $client = $server->accept or next;
    my $line = <$client>; my $auth = "";
    while (my $header = <$client>) {
        last if $header =~ /^\r?\n$/;
        $auth = $1 if $header =~ /^Authorization: Bearer (\S+)/i;
    }
    print "request $line";
    my $ok = !$ENV{ENGINE_KEY} || $auth eq $ENV{ENGINE_KEY};
    print $client ($ok ? "HTTP/1.0 200 OK" : "HTTP/1.0 401 Unauthorized"), "\r\nContent-Length: 2\r\n\r\nok";
    close $client;
}
"""
PREFIX = "modelpool-test-engines-"


@pytest.fixture
def host(container_host: ContainerHost) -> ContainerHost:
    return container_host


def spec_for(host: ContainerHost, runtime: Runtime, name: str, tmp_path: Path, **changes: object) -> ContainerSpec:
    port = free_port()
    fields: dict[str, object] = {
        "name": "perl-engine",
        "container": name,
        "runtime": runtime,
        "image": host.base_image,
        "argv": ("perl", "-e", SERVER, "{port}"),
        "port": port,
        "health_path": "/health",
        "env": {"ENGINE_FLAG": "on"},
        "api_key": "k-" + os.urandom(8).hex(),
        "api_key_env": "ENGINE_KEY",
        "labels": {LABEL_MODEL: "perl-engine"},
        "pull": "never",
        "start_timeout_s": 60.0,
        "stop_grace_s": 3.0,
        "log_file": tmp_path / "engine.log",
        "log_lines": 100,
    }
    fields.update(changes)
    return ContainerSpec(**fields)  # type: ignore[arg-type]


async def test_start_healthy_logs_and_crash_noticed(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "crash")
    exits: list[int | None] = []
    process = ContainerProcess(spec_for(host, runtime, names[0], tmp_path), on_exit=exits.append)
    spawned: list[int] = []
    await process.start(on_spawned=spawned.append)
    try:
        assert process.running and process.pid is not None and spawned == [process.pid]
        assert await process.check_health()  # with the key: the engine got it by name
        await until(lambda: any("flag=on" in line for line in process.lines), "the engine's first line")
        assert any("with key set" in line for line in process.lines)
        log_file = tmp_path / "engine.log"
        await until(lambda: "request GET /health" in log_file.read_text(), "the health probe in the log file")
        host.run("kill", "-s", "KILL", names[0])  # from outside, as an OOM kill would
        await until(lambda: bool(exits), "the exit to be noticed", timeout_s=30)
        assert not process.running
    finally:
        await process.stop()
    assert await inspect(runtime, names[0]) is None  # --rm: gone


async def test_stop_ends_it_within_grace(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "stop")
    exits: list[int | None] = []
    process = ContainerProcess(spec_for(host, runtime, names[0], tmp_path), on_exit=exits.append)
    await process.start()
    started = time.monotonic()
    await process.stop()
    assert time.monotonic() - started < 3.0 + 10.0
    assert await inspect(runtime, names[0]) is None
    assert "terminated" in (tmp_path / "engine.log").read_text()  # SIGTERM reached the engine
    assert exits == []  # a stop modelpool asked for is no crash


async def test_ignored_sigterm_is_killed_after_grace(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "stubborn")
    spec = spec_for(host, runtime, names[0], tmp_path, env={"IGNORE_TERM": "1"}, stop_grace_s=2.0)
    process = ContainerProcess(spec)
    await process.start()
    started = time.monotonic()
    await process.stop()
    took = time.monotonic() - started
    assert 2.0 <= took < 2.0 + 15.0, took
    assert await inspect(runtime, names[0]) is None


async def test_unhealthy_start_fails_with_output_and_removes_it(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "dies")
    spec = spec_for(host, runtime, names[0], tmp_path, argv=("perl", "-e", 'print "no weights here\\n"; exit 3'))
    with pytest.raises(ProcessFailed, match="exited"):
        await ContainerProcess(spec).start()
    assert await inspect(runtime, names[0]) is None


async def test_a_running_container_by_that_name_is_a_clear_error(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "taken")
    host.run("run", "-d", "--rm", "--name", names[0], "--entrypoint", "sleep", host.base_image, "300")
    with pytest.raises(Exception, match="already exists and is running"):
        await ContainerProcess(spec_for(host, runtime, names[0], tmp_path)).start()
    assert (await inspect(runtime, names[0])) is not None  # not ours: left alone


async def test_detach_leaves_it_running_and_adopt_follows_it(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "adopt")
    spec = spec_for(host, runtime, names[0], tmp_path)
    first = ContainerProcess(spec)
    await first.start()
    await first.detach()
    state = await inspect(runtime, names[0])
    assert state is not None and state.running and state.pid == first.pid
    exits: list[int | None] = []
    second = ContainerProcess(spec, on_exit=exits.append)
    assert first.pid is not None
    second.adopt(first.pid, first.started_at)
    assert await second.check_health()

    async def probe_seen() -> bool:  # `logs -f` follows new output only: ask until a probe shows
        await answers_health(spec.base_url + "/after-adoption", spec.api_key)
        return any("GET /after-adoption" in line for line in second.tail(50))

    await until_answered(probe_seen, "output after adoption")
    assert await stop_container(runtime, names[0], 3.0) == "terminated"
    await until(lambda: bool(exits), "the adopted container's end", timeout_s=30)
    await second.stop()


async def test_health_is_polled_until_the_engine_answers(
    host: ContainerHost, runtime: Runtime, names: list[str], tmp_path: Path
) -> None:
    names.append(PREFIX + "slow")
    slow = ("perl", "-e", "sleep 2; " + SERVER, "{port}")
    process = ContainerProcess(spec_for(host, runtime, names[0], tmp_path, argv=slow))
    await process.start()
    try:
        await until_answered(process.check_health, "health")
    finally:
        await process.stop()
