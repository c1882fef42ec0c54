"""`make test`'s runner (scripts/test_lanes.py): its two lanes cover every test file of tests/
exactly once, whatever folders are added later, and arguments that name tests run one pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]


def lanes_module() -> ModuleType:
    return load_script("test_lanes")


environments: list[dict[str, str] | None] = []
"""The `env` of every stand-in call and start, newest last."""


def recorder(calls: list[list[str]], code: int) -> Callable[..., int]:
    """A stand-in for `subprocess.call`: keeps the command, returns `code`."""

    def call(argv: list[str], env: dict[str, str] | None = None) -> int:
        calls.append(argv)
        environments.append(env)
        return code

    return call


def test_the_lanes_hold_every_test_file_once() -> None:
    module = lanes_module()
    first, second = module.parts()
    assert first[0] == "tests/e2e"
    moved = [f"tests/{name}" for name in module.SECOND_LANE_FILES]
    assert moved and set(moved) <= set(second)
    assert first[1:] == [f"--ignore={path}" for path in moved]

    def files(arguments: list[str]) -> set[Path]:
        found: set[Path] = set()
        for path in map(REPO.joinpath, (a for a in arguments if not a.startswith("--"))):
            found |= set(path.rglob("test_*.py")) if path.is_dir() else {path}
        ignored = {REPO / a.removeprefix("--ignore=") for a in arguments if a.startswith("--ignore=")}
        return found - ignored

    everything = set((REPO / "tests").rglob("test_*.py"))
    assert files(first) | files(second) == everything
    assert not files(first) & files(second)


@pytest.mark.parametrize(("args", "single"), [(["tests/api"], True), (["tests/api/x.py::t"], False), (["-x"], False)])
def test_arguments_naming_tests_run_one_pytest(monkeypatch: pytest.MonkeyPatch, args: list[str], single: bool) -> None:
    """A path that exists (a folder, a file, a test id in it) is run alone; an option is given to both lanes."""
    module = lanes_module()
    calls: list[list[str]] = []
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(module.subprocess, "call", recorder(calls, 0))

    monkeypatch.setattr(module.subprocess, "Popen", started_with(calls, lambda argv: 0))
    monkeypatch.setenv("MODELPOOL_TEST_LANES", "2")
    assert module.main(args) == 0
    assert len(calls) == (1 if single else 2), calls
    assert all(argv[:3] == [sys.executable, "-m", "pytest"] and argv[-len(args) :] == args for argv in calls)


def test_one_lane_asked_runs_one_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    module = lanes_module()
    calls: list[list[str]] = []
    monkeypatch.setattr(module.subprocess, "call", recorder(calls, 3))
    monkeypatch.setenv("MODELPOOL_TEST_LANES", "1")
    assert module.main(["-q"]) == 3  # pytest's own exit status
    assert calls == [[sys.executable, "-m", "pytest", "-q"]]


def test_a_failing_lane_fails_the_run() -> None:
    """Real pytest processes: one lane's failure is the run's, and both lanes' output is shown."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "test_lanes.py"), "-q", "-k", "no_test_has_this_name"],
            cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "MODELPOOL_TEST_LANES": "2"},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:]  # pytest exits 5 when it selects nothing
    assert "[lane1]" in done.stdout and "[lane2]" in done.stdout
    assert "failed: {'lane1': 5, 'lane2': 5}" in done.stdout


def started_with(calls: list[list[str]], code_of: Callable[[list[str]], int]) -> type:
    """A stand-in for `subprocess.Popen`: keeps the command; it prints nothing and exits with `code_of(argv)`."""

    class Started:
        def __init__(self, argv: list[str], env: dict[str, str] | None = None, **_: object) -> None:
            calls.append(argv)
            environments.append(env)
            self.argv = argv
            self.stdout: list[str] = []

        def wait(self) -> int:
            return code_of(self.argv)

    return Started


def test_with_checks_ruff_and_mypy_run_beside_the_lanes_and_a_failed_check_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = lanes_module()
    calls: list[list[str]] = []

    def mypy_on_tests_fails(argv: list[str]) -> int:
        return 1 if "mypy" in argv[0] and "tests" in argv else 0

    monkeypatch.setattr(module.subprocess, "Popen", started_with(calls, mypy_on_tests_fails))
    monkeypatch.setenv("MODELPOOL_TEST_LANES", "2")
    assert module.main(["--with-checks", "-q"]) == 1
    pytests = [argv for argv in calls if argv[:3] == [sys.executable, "-m", "pytest"]]
    checks = sorted(" ".join([Path(argv[0]).name, *argv[1:]]) for argv in calls if argv not in pytests)
    assert len(pytests) == 2 and all(argv[-1] == "-q" and "--with-checks" not in argv for argv in pytests)
    assert checks == ["mypy", "mypy --python-version 3.11 tests benchmarks", "ruff check src tests"]


def test_with_checks_and_named_tests_the_checks_run_beside_one_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    module = lanes_module()
    calls: list[list[str]] = []
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(module.subprocess, "Popen", started_with(calls, lambda argv: 0))
    assert module.main(["--with-checks", "tests/api"]) == 0
    assert [argv[3:] for argv in calls if argv[:3] == [sys.executable, "-m", "pytest"]] == [["tests/api"]]
    assert len(calls) == 1 + 3


@pytest.mark.parametrize("lanes", ["1", "2"])
def test_the_tests_threads_wait_passively_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch, lanes: str) -> None:
    module = lanes_module()
    calls: list[list[str]] = []
    monkeypatch.setattr(module.subprocess, "call", recorder(calls, 0))
    monkeypatch.setattr(module.subprocess, "Popen", started_with(calls, lambda argv: 0))
    monkeypatch.setenv("MODELPOOL_TEST_LANES", lanes)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    environments.clear()
    assert module.main(["-q"]) == 0
    assert len(environments) == int(lanes)
    assert all(env is not None and env["OMP_WAIT_POLICY"] == "PASSIVE" for env in environments)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the caller's own choice stands
    environments.clear()
    module.main(["-q"])
    assert all(env is not None and env["OMP_WAIT_POLICY"] == "ACTIVE" for env in environments)
