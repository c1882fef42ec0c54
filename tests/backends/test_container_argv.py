"""The container runtime's command lines for an engine (Docker and Podman), and the spec a
managed backend makes from its options. Pure: no runtime runs here (the live tests are in
tests/services/test_containers_*.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from modelpool.backends.context import BackendContext
from modelpool.backends.managed.container_options import ContainerOptions
from modelpool.backends.managed.containerized import container_spec, weights_mount
from modelpool.backends.managed.llama_server import LlamaServerBackend, LlamaServerOptions
from modelpool.backends.managed.vllm_serve import VllmOptions, VllmServeBackend
from modelpool.config.schema import ModelConfig
from modelpool.errors import ModelLoadFailed
from modelpool.services.container_argv import (
    LABEL_MODEL,
    LABEL_OWNER,
    LABEL_PORT,
    BindMount,
    ContainerSpec,
    Login,
    Runtime,
    client_environment,
    default_name,
    gpu_arguments,
    login_argv,
    run_argv,
    runtime_candidates,
    stop_argv,
)
from modelpool.services.container_cli import find_runtime

DOCKER = Runtime("/usr/bin/docker", "docker")
PODMAN = Runtime("/usr/bin/podman", "podman")
IMAGE = "ghcr.io/ggml-org/llama.cpp:server"


def spec(runtime: Runtime = PODMAN, **changes: Any) -> ContainerSpec:
    fields: dict[str, Any] = {
        "name": "qwen",
        "container": "modelpool-qwen-8101",
        "runtime": runtime,
        "image": IMAGE,
        "argv": ("/app/llama-server", "-m", "/models/q.gguf", "--port", "{port}"),
        "port": 8101,
        "api_key": "sekrit-key-value",
        "api_key_env": "LLAMA_API_KEY",
    }
    return ContainerSpec(**{**fields, **changes})


def value_of(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} occurs {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def test_run_argv_entrypoint_image_and_arguments() -> None:
    argv = run_argv(spec())
    assert argv[:3] == ["/usr/bin/podman", "run", "--rm"]
    assert "-d" not in argv  # attached: the client relays the output to the end
    assert "--sig-proxy=false" in argv  # ending the client leaves the container running
    assert value_of(argv, "--name") == "modelpool-qwen-8101"
    assert value_of(argv, "--entrypoint") == "/app/llama-server"
    image_at = argv.index(IMAGE)
    assert argv[image_at + 1 :] == ["-m", "/models/q.gguf", "--port", "8101"]
    assert argv.index("--entrypoint") < image_at  # every run flag before the image


def test_the_key_and_variables_go_by_name_only() -> None:
    argv = run_argv(spec(env={"HF_HUB_OFFLINE": "1", "TOKEN_LIKE": "value-not-shown"}, pass_env=("HF_TOKEN",)))
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert sorted(names) == ["HF_HUB_OFFLINE", "HF_TOKEN", "LLAMA_API_KEY", "TOKEN_LIKE"]
    assert not any("sekrit" in a or "value-not-shown" in a for a in argv)


def test_client_environment_carries_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    monkeypatch.setenv("CONTAINERS_CONF", "/etc/x.conf")
    monkeypatch.setenv("MODELPOOL_API_KEY", "not-for-engines")
    env = client_environment(spec(env={"A": "1"}, pass_env=("HF_TOKEN",)))
    assert env["LLAMA_API_KEY"] == "sekrit-key-value" and env["A"] == "1" and env["HF_TOKEN"] == "hf_abc"
    assert env["CONTAINERS_CONF"] == "/etc/x.conf"  # the runtime's own settings
    assert "MODELPOOL_API_KEY" not in env  # modelpool's keys stay with modelpool


def test_a_tool_variable_set_inside_is_literal_and_leaves_the_client_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    s = spec(env={"PATH": "/opt/venv/bin:/usr/bin"})
    assert "PATH=/opt/venv/bin:/usr/bin" in run_argv(s)
    assert client_environment(s)["PATH"] == "/usr/bin"


@pytest.mark.parametrize(
    ("runtime", "gpus", "expected"),
    [
        (DOCKER, "all", ["--gpus", "all"]),
        (DOCKER, "0", ["--gpus", '"device=0"']),
        (DOCKER, "0,1", ["--gpus", '"device=0,1"']),
        (PODMAN, "all", ["--device", "nvidia.com/gpu=all"]),
        (PODMAN, "0", ["--device", "nvidia.com/gpu=0"]),
        (PODMAN, "0,1", ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]),
        (PODMAN, None, []),
    ],
)
def test_gpus_per_runtime(runtime: Runtime, gpus: str | None, expected: list[str]) -> None:
    assert gpu_arguments(runtime.kind, gpus) == expected
    argv = run_argv(spec(runtime, gpus=gpus))
    assert all(part in argv for part in expected)


def test_network_ipc_shm_user_labels_mounts() -> None:
    host = run_argv(spec())
    assert value_of(host, "--network") == "host" and "-p" not in host
    bridge = run_argv(
        spec(network="bridge", ipc="host", shm_size="8g", user="1000:1000", labels={LABEL_MODEL: "qwen"},
             mounts=(BindMount(Path("/models/q.gguf"), "/models/q.gguf"), BindMount(Path("/data"), "/d", False)))
    )  # fmt: skip
    assert value_of(bridge, "--network") == "bridge" and value_of(bridge, "-p") == "127.0.0.1:8101:8101"
    assert value_of(bridge, "--ipc") == "host" and value_of(bridge, "--shm-size") == "8g"
    assert value_of(bridge, "--user") == "1000:1000" and value_of(bridge, "--label") == f"{LABEL_MODEL}=qwen"
    volumes = [bridge[i + 1] for i, a in enumerate(bridge) if a == "-v"]
    assert volumes == ["/models/q.gguf:/models/q.gguf:ro", "/data:/d"]


@pytest.mark.parametrize("pull", ["missing", "always", "never"])
def test_pull_policy(pull: str) -> None:
    assert value_of(run_argv(spec(pull=pull)), "--pull") == pull


def test_login_and_stop_argv() -> None:
    login = login_argv(DOCKER, Login("nvcr.io", "$oauthtoken", "NGC_API_KEY"))
    assert login == ["/usr/bin/docker", "login", "--username", "$oauthtoken", "--password-stdin", "nvcr.io"]
    assert stop_argv(PODMAN, "c", 20.4) == ["/usr/bin/podman", "stop", "-t", "20", "c"]


def test_default_name_is_predictable_and_valid() -> None:
    assert default_name("qwen", 8101) == "modelpool-qwen-8101"
    assert default_name("org/Model:v1 é", 9) == "modelpool-org-Model-v1---9"


def fake_runtime(folder: Path, name: str, *, answers: bool) -> None:
    """A runtime client whose `info` succeeds or fails (a docker client with no daemon)."""
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + ("exit 0\n" if answers else "echo 'Cannot connect to the daemon' >&2; exit 1\n"))
    tool.chmod(0o755)


def test_runtime_candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("docker", "podman"):
        fake_runtime(tmp_path, name, answers=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert runtime_candidates("auto") == [Runtime(str(tmp_path / "docker"), "docker"),
                                          Runtime(str(tmp_path / "podman"), "podman")]  # fmt: skip
    assert runtime_candidates("podman") == [Runtime(str(tmp_path / "podman"), "podman")]
    assert runtime_candidates(str(tmp_path / "podman"))[0].kind == "podman"
    (tmp_path / "docker").unlink()
    assert [r.kind for r in runtime_candidates("auto")] == ["podman"]
    with pytest.raises(ModelLoadFailed, match="'docker' is not an executable"):
        runtime_candidates("docker")
    (tmp_path / "podman").unlink()
    with pytest.raises(ModelLoadFailed, match="neither `docker` nor `podman`"):
        runtime_candidates("auto")
    with pytest.raises(ModelLoadFailed, match="/opt/nothing/podman"):
        runtime_candidates("/opt/nothing/podman")


async def test_auto_takes_the_first_runtime_that_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_runtime(tmp_path, "docker", answers=False)
    fake_runtime(tmp_path, "podman", answers=True)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert await find_runtime("auto") == Runtime(str(tmp_path / "podman"), "podman")
    assert await find_runtime("docker") == Runtime(str(tmp_path / "docker"), "docker")  # named: taken as it is


async def test_auto_with_no_runtime_that_answers_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("docker", "podman"):
        fake_runtime(tmp_path, name, answers=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ModelLoadFailed, match=r"docker info` failed: Cannot connect.*podman info` failed"):
        await find_runtime("auto")


# ----- from a backend's options ------------------------------------------------------------


def llama(tmp_path: Path, container: dict[str, Any], **options: Any) -> LlamaServerBackend:
    weights = tmp_path / "q.gguf"
    weights.write_bytes(b"GGUF")
    model = ModelConfig(id="qwen", backend="llama_server", source=str(weights))
    parsed = LlamaServerOptions.model_validate({"container": {"image": IMAGE, **container}, **options})
    return LlamaServerBackend(model, parsed, BackendContext())


def test_llama_server_in_a_container_runs_python3_and_mounts_the_weights(tmp_path: Path) -> None:
    backend = llama(tmp_path, {})
    weights = tmp_path / "q.gguf"
    assert backend.command(weights)[0] == "python3"  # the image's, not modelpool's interpreter
    assert backend.command(weights)[0] != sys.executable
    options = backend.options.container
    assert options is not None
    made = container_spec(backend._spec(weights), options, PODMAN, backend.files(weights), persistent=False)
    argv = run_argv(made)
    assert f"{weights}:{weights}:ro" in argv
    assert value_of(argv, "--entrypoint") == "python3"
    assert made.container == f"modelpool-qwen-{made.port}"
    assert made.labels[LABEL_PORT] == str(made.port) and made.labels[LABEL_OWNER].startswith(f"{os.getpid()}:")
    assert made.api_key_env == "API_KEY" and made.api_key and made.api_key not in " ".join(argv)


def test_native_binary_is_the_entrypoint_and_bridge_binds_every_address(tmp_path: Path) -> None:
    backend = llama(tmp_path, {"network": "bridge"}, binary="/app/llama-server")
    argv = backend.command(tmp_path / "q.gguf")
    assert argv[0] == "/app/llama-server" and value_of(argv, "--host") == "0.0.0.0"
    assert value_of(llama(tmp_path, {}, binary="/app/llama-server").command(tmp_path / "q.gguf"), "--host") == (
        "127.0.0.1"
    )


def test_persistent_has_no_owner_label_and_the_config_name_wins(tmp_path: Path) -> None:
    backend = llama(tmp_path, {"name": "my-engine"}, persistent=True)
    weights = tmp_path / "q.gguf"
    assert backend.options.container is not None
    made = container_spec(backend._spec(weights), backend.options.container, DOCKER, [weights], persistent=True)
    assert made.container == "my-engine" and LABEL_OWNER not in made.labels


def test_vllm_in_a_container_defaults_to_python3_and_a_hub_id_is_not_mounted(tmp_path: Path) -> None:
    model = ModelConfig(id="smol", backend="vllm_serve", source=str(tmp_path))
    options = VllmOptions.model_validate({"model": "org/name", "container": {"image": "vllm/vllm-openai:v0.9"}})
    backend = VllmServeBackend(model, options, BackendContext())
    assert backend.command(Path("org/name"))[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert weights_mount(Path("org/name")) is None


def test_a_file_in_a_hugging_face_cache_mounts_its_repo_folder(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_bytes(b"x")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "m.gguf").symlink_to("../../blobs/abc")
    assert weights_mount(snapshot / "m.gguf") == BindMount(repo, str(repo))


def test_hf_cache_mounts_hf_home_and_sets_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    backend = llama(tmp_path, {"hf_cache": True, "mounts": [{"source": str(tmp_path), "target": "/extra"}]})
    assert backend.options.container is not None
    made = container_spec(backend._spec(tmp_path / "q.gguf"), backend.options.container, PODMAN, [], persistent=True)
    assert made.env["HF_HOME"] == str(tmp_path / "hf")
    assert BindMount(tmp_path / "hf", str(tmp_path / "hf"), read_only=False) in made.mounts
    assert BindMount(tmp_path, "/extra") in made.mounts


def test_container_options_defaults() -> None:
    options = ContainerOptions(image=IMAGE)
    assert (options.runtime, options.network, options.pull, options.hf_cache) == ("auto", "host", "missing", False)
