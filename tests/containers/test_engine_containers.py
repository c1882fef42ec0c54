"""Engines as containers, for real: a locally built engine image (llama.cpp's server as
llama-cpp-python packages it, on the starter GGUF) run by a real `modelpool serve` through
Podman (or Docker): started, used through the pool with the official openai SDK, its logs
read, stopped, adopted after a modelpool restart, killed from outside and restarted, reaped
after its modelpool was SIGKILLed, and pulled behind a registry login (a stand-in registry
that a real `podman login` talks to).

The container runtime is the witness of what runs (`podman ps`/`inspect`, by the model's
label), not modelpool's status. Every model id starts with PREFIX, so the containers
modelpool names after it (`modelpool-<model>-<port>`) are this module's, and each test
removes its own at the end, whatever happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.containers.engines import (
    PREFIX,
    EngineImage,
    build_engine_image,
    containers,
    engine_model,
    env_value,
    remove_containers,
    write_config,
)
from tests.containers.host import PREBUILT, ContainerHost, wait_for_prebuild
from tests.containers.registry_standin import RegistryStandin, registries_conf, registry_standin
from tests.polling import wait_until
from tests.processes import Server, modelpool_serve

pytestmark = pytest.mark.e2e

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
TIMEOUT_S = 120
GRACE_S = 5  # the models' stop_grace_s (engine_model)


@pytest.fixture(scope="session")
def engine_image(container_host: ContainerHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineImage]:
    wait_for_prebuild()
    image = build_engine_image(container_host, tmp_path_factory.mktemp("engine-image"))
    print(f"\nengine image {image.tag}: built in {image.build_s:.1f}s, {image.size_bytes / 1e6:.0f} MB")
    yield image
    container_host.remove_image(image.tag)
    container_host.remove_image(f"{PREBUILT}:llama")


@pytest.fixture
def model_ids(container_host: ContainerHost) -> Iterator[Callable[[str], str]]:
    """Model ids for this test (`PREFIX-<name>`); their containers are removed at the end."""
    made: list[str] = []

    def model_id(name: str) -> str:
        made.append(f"{PREFIX}-{name}")
        return made[-1]

    yield model_id
    for made_id in made:
        remove_containers(container_host, made_id)


def sdk(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def admin(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=TIMEOUT_S)


def load(target: httpx.Client | Server, model: str) -> dict:
    if isinstance(target, Server):
        with admin(target) as client:
            return load(client, model)
    response = target.post(f"/v1/admin/models/{model}/load")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "ready"
    return response.json()


def answers(server_url: str, model: str) -> str:
    with sdk(server_url) as oai:
        reply = oai.chat.completions.create(
            model=model, messages=HI, max_tokens=4, temperature=0, extra_body={"min_tokens": 1}
        )
    assert reply.choices[0].message.content and reply.model == model
    return reply.choices[0].message.content


def test_an_engine_container_serves_logs_and_is_gone_after_unload(
    tmp_path: Path, container_host: ContainerHost, engine_image: EngineImage, model_ids: Callable[[str], str]
) -> None:
    model = model_ids("serve")
    config = write_config(tmp_path, {model: engine_model(container_host, engine_image)})
    with (
        modelpool_serve(tmp_path / "server.log", "-c", str(config), env=container_host.env) as server,
        admin(server) as client,
    ):
        started = time.monotonic()
        port = load(client, model)["replicas"][0]["port"]
        print(f"\nengine container: load (start to healthy) took {time.monotonic() - started:.1f}s")
        [running] = containers(container_host, model)
        assert running.name == f"modelpool-{model}-{port}"  # predictable: replicas differ by port
        assert running.labels["io.modelpool.port"] == str(port)
        assert running.labels["io.modelpool.owner"].startswith(f"{server.process.pid}:")  # not persistent: owned

        with sdk(server.url) as oai:
            reply = oai.chat.completions.create(
                model=model, messages=HI, max_tokens=8, temperature=0, extra_body={"min_tokens": 8}
            )
            stream = oai.chat.completions.create(
                model=model, messages=HI, max_tokens=8, temperature=0, stream=True, extra_body={"min_tokens": 8}
            )
            streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens == 8
        assert streamed == reply.choices[0].message.content  # greedy: the same text either way

        logs = client.get(f"/v1/admin/models/{model}/logs", params={"lines": 50}).json()
        assert any("POST /v1/chat/completions" in line for line in logs["processes"][0]["lines"]), logs
        key = env_value(running, "API_KEY")  # the engine's key: inside the container, by name only
        assert key and running.command_line and not any(key in arg for arg in running.command_line)

        unloaded = client.post(f"/v1/admin/models/{model}/unload")
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
        wait_until(lambda: containers(container_host, model) == [], "the container to stop", GRACE_S + 5)
        assert containers(container_host, model, every=True) == []  # `run --rm`: removed, not left stopped
    assert key not in server.log_text()


def test_a_persistent_engine_container_is_adopted_by_the_next_modelpool(
    tmp_path: Path, container_host: ContainerHost, engine_image: EngineImage, model_ids: Callable[[str], str]
) -> None:
    model = model_ids("persistent")
    settings = engine_model(container_host, engine_image, options={"persistent": True})
    config = write_config(tmp_path, {model: settings})
    with modelpool_serve(tmp_path / "first.log", "-c", str(config), env=container_host.env) as server:
        first_port = load(server, model)["replicas"][0]["port"]
        [first] = containers(container_host, model)
        assert "io.modelpool.owner" not in first.labels  # nobody's to stop: it outlives modelpool
    assert containers(container_host, model) == [first]  # modelpool stopped; the container did not

    with modelpool_serve(tmp_path / "second.log", "-c", str(config), env=container_host.env) as server:
        adopted = load(server, model)["replicas"][0]
        assert adopted["port"] == first_port
        assert containers(container_host, model) == [first]  # the same container, and no second one
        answers(server.url, model)  # with the key the first modelpool saved
    assert containers(container_host, model) == [first]

    state_dir = tmp_path / "state"
    stop = [sys.executable, "-m", "modelpool", "stop-persistent", "--state-dir", str(state_dir), "--grace", "5"]
    done = subprocess.run(stop, capture_output=True, text=True, timeout=TIMEOUT_S, env=container_host.env)
    assert done.returncode == 0 and model in done.stdout, done.stdout + done.stderr
    wait_until(lambda: containers(container_host, model) == [], "stop-persistent to stop the container", 10)


def test_a_container_killed_from_outside_is_restarted(
    tmp_path: Path, container_host: ContainerHost, engine_image: EngineImage, model_ids: Callable[[str], str]
) -> None:
    model = model_ids("killed")
    config = write_config(tmp_path, {model: engine_model(container_host, engine_image)})
    with (
        modelpool_serve(tmp_path / "server.log", "-c", str(config), env=container_host.env) as server,
        admin(server) as client,
    ):
        load(client, model)
        [first] = containers(container_host, model)
        container_host.run("kill", first.name)

        def failed() -> bool:
            return client.get(f"/v1/admin/models/{model}/status").json()["state"] == "failed"

        wait_until(failed, "modelpool to notice the container's exit", 15)
        status = client.get(f"/v1/admin/models/{model}/status").json()
        assert status["crashes_in_a_row"] == 1 and status["last_error"], status

        answers(server.url, model)  # the request restarts it
        restarted = client.get(f"/v1/admin/models/{model}/status").json()
        assert restarted["state"] == "ready"
        [second] = containers(container_host, model)  # the killed one is gone (`--rm`), one new
        assert second.id != first.id and second.name == f"modelpool-{model}-{restarted['replicas'][0]['port']}"


def test_the_next_modelpool_stops_a_container_whose_modelpool_was_killed(
    tmp_path: Path, container_host: ContainerHost, engine_image: EngineImage, model_ids: Callable[[str], str]
) -> None:
    model = model_ids("orphan")
    config = write_config(tmp_path, {model: engine_model(container_host, engine_image)})
    with modelpool_serve(tmp_path / "first.log", "-c", str(config), env=container_host.env) as server:
        load(server, model)
        [orphan] = containers(container_host, model)
        os.kill(server.process.pid, signal.SIGKILL)  # no shutdown: nothing stops the container
        server.process.wait()
    assert containers(container_host, model) == [orphan]

    with modelpool_serve(tmp_path / "second.log", "-c", str(config), env=container_host.env):
        wait_until(lambda: containers(container_host, model) == [], "the reaper to stop the orphan", GRACE_S + 15)


class ArgvWatch:
    """Every command line on the machine while it runs (as `ps` would show them), sampled in
    a thread, so a test can say a secret was on none."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="argv-watch", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for process in psutil.process_iter(["cmdline"]):
                with self._lock:
                    self.seen.add(tuple(process.info["cmdline"] or ()))
            self._stop.wait(0.01)

    def saw(self, word: str) -> bool:
        with self._lock:
            return any(word in command for command in self.seen)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def login_model(host: ContainerHost, image: EngineImage, registry: RegistryStandin, variable: str) -> dict:
    login = {"registry": registry.address, "username": registry.username, "password_env": variable}
    return engine_model(host, image, container={"login": login})


def test_a_registry_login_when_its_variable_is_set_with_the_secret_on_no_command_line(
    tmp_path: Path, container_host: ContainerHost, engine_image: EngineImage, model_ids: Callable[[str], str]
) -> None:
    if container_host.cli != "podman":
        pytest.skip("the stand-in registry is plain HTTP: Podman allows it per client, Docker only in its daemon")
    right, wrong, unset = model_ids("login"), model_ids("login-wrong"), model_ids("login-unset")
    secret, bad_secret = "right-secret-4f1c9a", "wrong-secret-77d2e0"
    with (
        registry_standin("$oauthtoken", secret) as for_right,
        registry_standin("$oauthtoken", secret) as for_wrong,
        registry_standin("$oauthtoken", secret) as for_unset,
        ArgvWatch() as argv,
    ):
        # The login client stays alive until the watch has seen it: its argv is checked, not missed.
        for registry in (for_right, for_wrong):
            registry.before_answering_credentials = lambda: wait_until(lambda: argv.saw("login"), "`login` in ps")
        models = {
            right: login_model(container_host, engine_image, for_right, "MODELPOOL_TEST_REGISTRY_PASSWORD"),
            wrong: login_model(container_host, engine_image, for_wrong, "MODELPOOL_TEST_REGISTRY_WRONG"),
            unset: login_model(container_host, engine_image, for_unset, "MODELPOOL_TEST_REGISTRY_UNSET"),
        }
        config = write_config(tmp_path, models)
        env = {**container_host.env, "REGISTRY_AUTH_FILE": str(tmp_path / "auth.json"),
               "CONTAINERS_REGISTRIES_CONF": str(registries_conf(tmp_path / "registries.conf", for_right, for_wrong,
                                                                 for_unset)),
               "MODELPOOL_TEST_REGISTRY_PASSWORD": secret, "MODELPOOL_TEST_REGISTRY_WRONG": bad_secret}  # fmt: skip
        env.pop("MODELPOOL_TEST_REGISTRY_UNSET", None)
        with modelpool_serve(tmp_path / "server.log", "-c", str(config), env=env) as server, admin(server) as client:
            load(client, right)
            credentials = [(a.username, a.password, a.status) for a in for_right.credentialed()]
            assert credentials == [("$oauthtoken", secret, 200)]
            assert for_right.address in (tmp_path / "auth.json").read_text()  # podman kept the login
            answers(server.url, right)

            load(client, unset)
            assert for_unset.attempts == []  # no variable, no login

            refused = client.post(f"/v1/admin/models/{wrong}/load")
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "model_load_error" and "login" in error["message"].lower(), error
            assert bad_secret not in refused.text
            assert [a.password for a in for_wrong.credentialed()] == [bad_secret]
            assert containers(container_host, wrong, every=True) == []  # refused before `run`
            logs = client.get(f"/v1/admin/models/{right}/logs").text
    assert argv.saw("login")
    for command in argv.seen:
        assert not any(secret in arg or bad_secret in arg for arg in command), command
    for line in [*server.log_text().splitlines(), logs]:
        assert secret not in line and bad_secret not in line
