"""`options.container` is written onto a container runtime's command line, so a value that
would add a flag there (privileges, the host's devices, files or namespaces, another image)
is a clear config error; an admin's load-time override cannot change it at all; and a
registry password or engine key never reaches a command line or an error message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelpool.backends.managed.container_options import run_args_problem
from modelpool.backends.registry import parse_options
from modelpool.config.schema import ModelConfig
from modelpool.errors import ConfigError, ModelLoadFailed
from modelpool.services.container_argv import ContainerSpec, Login, Runtime
from modelpool.services.containers import ContainerProcess
from tests.conftest import serving


def options_error(container: dict[str, Any]) -> str:
    model = ModelConfig(id="m", backend="llama_server", source="/etc/hostname",
                        options={"container": {"image": "ghcr.io/ggml-org/llama.cpp:server", **container}})  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        parse_options(model)
    return caught.value.message


@pytest.mark.parametrize(
    ("run_args", "named"),
    [
        (["--privileged"], "'--privileged'"),
        (["--cap-add", "ALL"], "'--cap-add'"),
        (["--cap-add=SYS_ADMIN"], "'--cap-add'"),
        (["--security-opt", "seccomp=unconfined"], "'--security-opt'"),
        (["--device", "/dev/sda"], "'--device'"),
        (["--gpus", "all"], "'--gpus'"),
        (["-v", "/:/host"], "'-v'"),
        (["--volume=/etc:/etc"], "'--volume'"),
        (["--mount", "type=bind,src=/,dst=/h"], "'--mount'"),
        (["--volumes-from", "other"], "'--volumes-from'"),
        (["--pid", "host"], "'--pid'"),
        (["--pid=host"], "'--pid'"),
        (["--userns=host"], "'--userns'"),
        (["--ipc", "host"], "'--ipc'"),
        (["--network", "container:x"], "'--network'"),
        (["-p", "0.0.0.0:80:80"], "'-p'"),
        (["-e", "LLAMA_API_KEY=known"], "'-e'"),
        (["--env-file", "/etc/shadow"], "'--env-file'"),
        (["--user", "0"], "'--user'"),
        (["--group-add", "docker"], "'--group-add'"),
        (["--sysctl", "kernel.x=1"], "'--sysctl'"),
        (["--entrypoint", "/bin/sh"], "'--entrypoint'"),
        (["--name", "other"], "'--name'"),
        (["--label", "io.modelpool.owner=1:1"], "'--label'"),
        (["--restart", "always"], "'--restart'"),
        (["--log-driver", "none"], "'--log-driver'"),
        (["--cpus", "--privileged"], "stands where a value belongs"),
        (["--init", "alpine", "sh"], "'alpine'"),  # a stray word would be read as the image
        (["--", "--privileged"], "'--'"),
        (["--cpus"], "end with a flag that needs a value"),
        (["--cpus="], "takes a value"),
        (["--init=true"], "takes no value"),
    ],
)
def test_run_args_that_widen_are_refused(run_args: list[str], named: str) -> None:
    assert named in options_error({"run_args": run_args})


def test_resource_run_args_are_accepted() -> None:
    accepted = ["--cpus", "4", "--memory=16g", "--ulimit", "memlock=-1", "--init", "--pids-limit", "512"]
    assert run_args_problem(accepted) is None


@pytest.mark.parametrize(
    ("container", "named"),
    [
        ({"image": "--privileged"}, "not an image reference"),
        ({"image": "alpine --privileged"}, "not an image reference"),
        ({"image": "alpine;rm -rf /"}, "not an image reference"),
        ({"image": "Upper/Case"}, "not an image reference"),
        ({"name": "-x"}, "name"),
        ({"name": "a/b"}, "name"),
        ({"name": "n" * 200}, "name"),
        ({"runtime": "bin/docker"}, "runtime"),
        ({"runtime": "docker --host tcp://evil"}, "runtime"),
        ({"gpus": "0;1"}, "gpus"),
        ({"gpus": "--privileged"}, "gpus"),
        ({"gpus": "all,0"}, "gpus"),
        ({"shm_size": "8g --privileged"}, "shm_size"),
        ({"user": "0 --privileged"}, "user"),
        ({"user": "--privileged"}, "user"),
        ({"network": "container:other"}, "network"),
        ({"ipc": "container:other"}, "ipc"),
        ({"pull": "sometimes"}, "pull"),
        ({"mounts": [{"source": "/data", "target": "relative"}]}, "absolute path"),
        ({"mounts": [{"source": "/data", "target": "/a:/b"}]}, "absolute path"),
        ({"mounts": [{"source": "/data", "target": "/a/../../etc"}]}, "'..'"),
        ({"mounts": [{"source": "/a,b", "target": "/a"}]}, "without ':' or ','"),
        ({"mounts": [{"source": "relative", "target": "/a"}]}, "absolute path"),
        ({"env": {"A-B": "1"}}, "not a variable name"),
        ({"env": {"1X": "1"}}, "not a variable name"),
        ({"env": {"OK": "a\x00b"}}, "NUL"),
        ({"login": {"registry": "nvcr.io", "username": "--password=x", "password_env": "NGC_API_KEY"}}, "username"),
        ({"login": {"registry": "-x", "username": "u", "password_env": "NGC_API_KEY"}}, "registry"),
        ({"login": {"registry": "nvcr.io", "username": "u", "password_env": "NGC API KEY"}}, "password_env"),
        ({"login": {"registry": "nvcr.io", "username": "u", "password": "inline"}}, "password"),
        ({"privileged": True}, "privileged"),
        ({"mounts": [{"source": "/d", "target": "/d"}] * 33}, "mounts"),
    ],
)
def test_values_that_would_reach_the_command_line_are_checked(container: dict[str, Any], named: str) -> None:
    assert named in options_error(container)


async def test_an_override_cannot_change_the_container(tmp_path: Path) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF")
    container = {"image": "ghcr.io/ggml-org/llama.cpp:server", "runtime": "podman"}
    model = {"backend": "llama_server", "source": str(weights), "preload": False,
             "options": {"binary": "/app/llama-server", "container": container}}  # fmt: skip
    config = {"enabled_models": ["boxed"], "state_dir": str(tmp_path / "state"), "models": {"boxed": model}}
    async with serving(config) as (app, client):
        for overrides in ({"container": {**container, "run_args": ["--cpus", "2"]}}, {"container": None}):
            answer = await client.post("/v1/admin/models/boxed/load", json={"overrides": overrides})
            assert answer.status_code == 400, answer.text
            assert "cannot override container" in answer.json()["error"]["message"]
            assert app.state.pool.status("boxed").state == "unloaded"


FAKE_RUNTIME = """#!/bin/sh
echo "$@" >> {argv_log}
cat > {stdin_log}
echo "Error: login to $6 failed: unauthorized for password $(cat {stdin_log})" >&2
exit 1
"""


async def test_a_failed_login_says_so_without_the_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    password = "ngc-very-secret-value"
    monkeypatch.setenv("NGC_API_KEY", password)
    runtime = tmp_path / "podman"
    runtime.write_text(FAKE_RUNTIME.format(argv_log=tmp_path / "argv", stdin_log=tmp_path / "stdin"))
    runtime.chmod(0o755)
    spec = ContainerSpec(name="m", container="c", runtime=Runtime(str(runtime), "podman"), image="nvcr.io/x/y:1",
                         argv=("serve",), port=1, login=Login("nvcr.io", "$oauthtoken", "NGC_API_KEY"))  # fmt: skip
    with pytest.raises(ModelLoadFailed) as caught:
        await ContainerProcess(spec).start()
    message = str(caught.value)
    assert "podman login nvcr.io` as $oauthtoken failed" in message and "$NGC_API_KEY" in message
    assert password not in message and "***" in message
    assert (tmp_path / "stdin").read_text() == password  # on stdin only
    assert password not in (tmp_path / "argv").read_text()


async def test_no_login_without_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NGC_API_KEY", raising=False)
    runtime = tmp_path / "podman"
    runtime.write_text("#!/bin/sh\necho \"$1\" >> " + str(tmp_path / "calls") + "\nexit 1\n")
    runtime.chmod(0o755)
    spec = ContainerSpec(name="m", container="c", runtime=Runtime(str(runtime), "podman"), image="nvcr.io/x/y:1",
                         argv=("serve",), port=1, start_timeout_s=5,
                         login=Login("nvcr.io", "$oauthtoken", "NGC_API_KEY"))  # fmt: skip
    with pytest.raises(ModelLoadFailed):
        await ContainerProcess(spec).start()
    assert "login" not in (tmp_path / "calls").read_text().split()
