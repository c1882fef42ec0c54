"""`make install`'s stamps are keyed on the build settings: a changed TORCH_SPEC, TORCH_INDEX,
LLAMA_SPEC, LLAMA_CMAKE_ARGS or GPU redoes the step it changes and no other, a copy of the
same files finds the venv up to date, and PyTorch's index is handed to pip only when it can
be reached. Run on a copy of the Makefile whose venv has a pip that only writes down what it
was asked (make itself, and the reachability check, are the real ones)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelpool.services.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
FILES = ("Makefile", "pyproject.toml", "constraints.txt", "scripts/index_reachable.py")

if shutil.which("make") is None:  # pragma: no cover - make is how the project installs
    pytest.skip("make is not installed", allow_module_level=True)


def copy_of_the_repo(folder: Path) -> Path:
    for name in FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, folder / name)
    return folder


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv whose python is the real one and whose pip appends its arguments to pip.log
    (and, asked for a wheel, leaves an empty file of that name)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    # `pip wheel ... -w DIR` leaves a wheel in DIR, as the real one does. $WHEEL_S and $TORCH_S
    # make the compile and PyTorch's install take that long; each call logs its end too.
    log = tmp_path / "venv" / "pip.log"
    stub = """#!/bin/sh
echo "$*" >> LOG
case "$*" in *torch==*) sleep "${TORCH_S:-0}";; esac
if [ "$1" = wheel ]; then
  sleep "${WHEEL_S:-0}"
  for a; do
    [ "$w" = 1 ] && mkdir -p "$a" && touch "$a/llama_cpp_python-0-py3-none-any.whl"
    [ "$a" = -w ] && w=1 || w=
  done
fi
echo "$1 done" >> LOG
"""
    (bin_dir / "pip").write_text(stub.replace("LOG", str(log)))
    (bin_dir / "pip").chmod(0o755)
    return tmp_path / "venv"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_of_the_repo(tmp_path / "repo")


def make(repo: Path, venv: Path, *args: str, dry: bool = False) -> subprocess.CompletedProcess[str]:
    argv = ["make", "-C", str(repo), *(["-n"] if dry else []), "install", f"VENV={venv}", *args]
    env = {**os.environ, "MAKEFLAGS": ""}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)


def pip_calls(venv: Path) -> list[str]:
    log = venv / "pip.log"
    calls = [line for line in log.read_text().splitlines() if not line.endswith(" done")] if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def up_to_date(repo: Path, venv: Path, *args: str) -> bool:
    argv = ["make", "-C", str(repo), "-q", "install", f"VENV={venv}", *args]
    return subprocess.run(argv, capture_output=True, env={**os.environ, "MAKEFLAGS": ""}, timeout=60).returncode == 0


def steps(output: str) -> set[str]:
    """Which install steps a `make -n` would run."""
    found = set()
    if "scripts/index_reachable.py" in output:
        found.add("torch")
    if "llama_cpp_python-" in output:
        found.add("llama")
    if '-e ".[' in output:
        found.add("project")
    return found


@pytest.fixture
def installed(repo: Path, venv: Path) -> Path:
    make(repo, venv, "TORCH_INDEX=")
    assert len(pip_calls(venv)) == 5  # torch, the llama wheel built and installed, the project, the GGUF
    return venv


def test_a_first_install_runs_every_step_then_nothing(repo: Path, venv: Path) -> None:
    assert steps(make(repo, venv, "TORCH_INDEX=", dry=True).stdout) == {"torch", "llama", "project"}
    make(repo, venv, "TORCH_INDEX=")
    calls = pip_calls(venv)
    assert calls[0].endswith("torch==2.13.0")
    assert calls[1].startswith("wheel --no-deps --no-cache-dir llama-cpp-python==")
    assert up_to_date(repo, venv, "TORCH_INDEX=")
    make(repo, venv, "TORCH_INDEX=")
    assert pip_calls(venv) == []


def test_under_make_j_the_llama_wheel_compiles_while_torch_installs(repo: Path, venv: Path) -> None:
    """`make test` installs with -j3: the ~5 min compile overlaps PyTorch's install (and the
    apt steps), while the pip steps that write into the venv still run one at a time."""
    argv = ["make", "-C", str(repo), "--jobs=3", "install", f"VENV={venv}", "TORCH_INDEX="]
    env = {**os.environ, "MAKEFLAGS": "", "WHEEL_S": "2", "TORCH_S": "4"}
    subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=True)
    lines = (venv / "pip.log").read_text().splitlines()
    torch = lines.index("install -c constraints.txt torch==2.13.0")
    assert torch < lines.index("wheel done") < lines.index("install done"), lines  # compiled during PyTorch's 4 s
    installs = [line.endswith(" done") for line in lines if line.startswith("install")]
    assert installs == [False, True] * 4, lines  # each install starts after the one before it ended


def test_an_identical_copy_of_the_repo_finds_the_venv_up_to_date(installed: Path, tmp_path: Path) -> None:
    """What `make serve` in a fresh clone, pointed at an installed venv, relies on."""
    clone = copy_of_the_repo(tmp_path / "clone")
    assert up_to_date(clone, installed, "TORCH_INDEX=")


@pytest.mark.parametrize(
    ("setting", "redone"),
    [
        ("TORCH_SPEC=torch==2.14.0", {"torch"}),
        ("TORCH_INDEX=https://download.pytorch.org/whl/cu126", {"torch"}),
        ("LLAMA_CMAKE_ARGS=-DGGML_CUDA=ON", {"llama"}),
        ("LLAMA_SPEC=llama-cpp-python==0.3.37", {"llama"}),
        ("GPU=cuda", {"torch", "llama"}),
    ],
)
def test_a_changed_build_setting_redoes_its_step_only(
    repo: Path, installed: Path, setting: str, redone: set[str]
) -> None:
    args = (setting,) if setting.startswith("TORCH_INDEX") or setting == "GPU=cuda" else ("TORCH_INDEX=", setting)
    assert not up_to_date(repo, installed, *args)
    assert steps(make(repo, installed, *args, dry=True).stdout) == redone


def test_a_gpu_build_asks_for_cuda_wheels_and_never_reuses_the_cpu_llama_wheel(repo: Path, installed: Path) -> None:
    plan = make(repo, installed, "GPU=cuda", dry=True).stdout
    assert "https://download.pytorch.org/whl/cu128" in plan
    assert 'CMAKE_ARGS="-DGGML_CUDA=ON' in plan
    cpu_plan = make(repo, installed, "TORCH_INDEX=", "LLAMA_SPEC=llama-cpp-python==0.3.37", dry=True).stdout
    wheel_dir = next(word for word in plan.split() if word.startswith(".wheels/"))
    assert wheel_dir not in cpu_plan, "the wheel cache is keyed on the build flags"


def test_switching_back_reinstalls_what_the_switch_replaced(repo: Path, installed: Path) -> None:
    make(repo, installed, "TORCH_INDEX=", "TORCH_SPEC=torch==2.14.0")
    assert [call.split()[-1] for call in pip_calls(installed)] == ["torch==2.14.0"]
    assert not up_to_date(repo, installed, "TORCH_INDEX=")
    make(repo, installed, "TORCH_INDEX=")
    assert [call.split()[-1] for call in pip_calls(installed)] == ["torch==2.13.0"]


def test_a_changed_pyproject_redoes_the_project_step_only(repo: Path, installed: Path) -> None:
    with (repo / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# a change\n")
    assert steps(make(repo, installed, "TORCH_INDEX=", dry=True).stdout) == {"project"}


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_reachable_torch_index_is_handed_to_pip(repo: Path, venv: Path, index_url: str) -> None:
    make(repo, venv, f"TORCH_INDEX={index_url}")
    assert pip_calls(venv)[0] == f"install -c constraints.txt --extra-index-url {index_url} torch==2.13.0"


def test_an_unreachable_torch_index_is_left_out_with_a_warning(repo: Path, venv: Path) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}/whl/cpu"  # nothing listens there
    done = make(repo, venv, f"TORCH_INDEX={unreachable}")
    assert pip_calls(venv)[0] == "install -c constraints.txt torch==2.13.0"
    assert f"warning: {unreachable} cannot be reached" in done.stdout
