"""`make test`'s runner: the suite in two pytest processes at once ("lanes"), each on its own
part of tests/, their output interleaved line by line with the lane's name in front.

Why: run one after another the tests leave part of two cores idle (they wait on subprocess
servers starting, container builds, Ray clusters, sockets). Measured on the 2-core VM
(2026-11-28): the suite took 61.6 minutes in one process; in two lanes 45.5 minutes, when the
first lane held tests/e2e and tests/abuse (45.5 min) and the second the rest (33.4 min). So
tests/abuse (~5 min alone) moved to the second lane. The parts are whole folders (and a few
whole files of the first lane's folders, SECOND_LANE_FILES), so every session fixture of a
folder's conftest (a Ray cluster, the container image, the UI's browser) is made by one lane only.

MODELPOOL_TEST_LANES=1 (or a one-core machine) runs the whole suite in one process, as
`python -m pytest`; so do arguments that name tests (`make test PYTEST_ARGS=tests/api`).
Other arguments are passed to every lane's pytest. With `--with-checks` (`make test` gives
it) ruff and mypy run too, as a lane of their own beside the tests: a failed check fails
the run, after the tests have run too, so one run reports both."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
FIRST_LANE = ("e2e",)
"""Folders of tests/ the first lane runs; the second runs every other one."""
SECOND_LANE_FILES = ("e2e/test_stacks.py",)
"""Files inside FIRST_LANE's folders that the second lane runs, to even the lanes out: in the
full run of 2026-11-29 the first lane took 1857 s and the second 1615 s; test_stacks.py
(~100 s, its own subprocess servers, no session fixture of tests/e2e) evens them. Whole
files only, so a module fixture is still made once."""


def lanes_wanted() -> int:
    asked = os.environ.get("MODELPOOL_TEST_LANES", "")
    if asked:
        return max(1, int(asked))
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def parts() -> list[list[str]]:
    """The two lanes' pytest arguments (paths relative to the repository): tests/ split by
    FIRST_LANE, with SECOND_LANE_FILES moved over (`--ignore`d by the first lane)."""
    entries = sorted(
        p
        for p in TESTS.iterdir()
        if (p.is_dir() and not p.name.startswith(("_", ".")) and any(p.rglob("test_*.py")))
        or (p.is_file() and p.name.startswith("test_") and p.suffix == ".py")
    )
    first = [f"tests/{p.name}" for p in entries if p.name in FIRST_LANE]
    second = [f"tests/{p.name}" for p in entries if p.name not in FIRST_LANE]
    missing = set(FIRST_LANE) - {p.name for p in entries}
    assert not missing, f"tests/ has no {sorted(missing)}: update FIRST_LANE in {Path(__file__).name}"
    gone = [name for name in SECOND_LANE_FILES if not (TESTS / name).is_file()]
    assert not gone, f"tests/ has no {gone}: update SECOND_LANE_FILES in {Path(__file__).name}"
    first += [f"--ignore=tests/{name}" for name in SECOND_LANE_FILES]
    second += [f"tests/{name}" for name in SECOND_LANE_FILES]
    return [first, second]


CHECKS_FLAG = "--with-checks"
"""Also run the static checks (ruff, mypy) as a third lane, beside the tests."""
CHECKS = (
    ("ruff", "check", "src", "tests"),
    ("mypy",),  # strict on src/ (pyproject)
    ("mypy", "--python-version", "3.11", "tests", "benchmarks"),  # not strictly (pyproject's overrides)
)
"""Run one after another in the checks lane, each whatever the one before said: ~3 min of one
core, cold (mypy's two runs: 71 s and 96 s on the 2-core VM), which the test lanes would
otherwise wait for."""


QUIET_THREADS = {"OMP_WAIT_POLICY": "PASSIVE"}
"""For the tests' processes (and the servers, engines and clusters they start), unless set:
OpenMP threads (PyTorch's, llama.cpp's) that wait for work sleep rather than spin. Two
lanes keep more threads busy than there are cores, and a spinning thread holds a core the
thread it waits for needs: a 120-token stream beside three busy processes took 15–17 s
spinning against 8.5–9 s passive (tests/e2e SIGTERM test, twice each). Tests measure no
speed (benchmarks do), so nothing they check changes."""


def test_environment() -> dict[str, str]:
    return {**QUIET_THREADS, **os.environ}


def relay(name: str, pipe: subprocess.Popen[str]) -> None:
    assert pipe.stdout is not None
    for line in pipe.stdout:
        sys.stdout.write(f"[{name}] {line}")
        sys.stdout.flush()


class Lane(threading.Thread):
    """Its commands one after another, each to its end; the lane's exit status is the first
    non-zero one (0 when all passed)."""

    def __init__(self, name: str, commands: list[list[str]]) -> None:
        super().__init__(name=name, daemon=True)
        self.commands, self.code = commands, 0
        self.process: subprocess.Popen[str] | None = None

    def run(self) -> None:
        for argv in self.commands:
            print(f"[{self.name}] {' '.join(argv[2:] if argv[0] == sys.executable else argv)}", flush=True)
            self.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=test_environment()
            )
            relay(self.name, self.process)
            self.code = self.code or self.process.wait()


def tool(name: str) -> str:
    """A tool of the environment running this script (the venv's ruff and mypy)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def main(args: list[str]) -> int:
    checks = CHECKS_FLAG in args
    args = [arg for arg in args if arg != CHECKS_FLAG]
    pytest = [sys.executable, "-m", "pytest"]
    names_tests = any(not arg.startswith("-") and Path(arg.split("::")[0]).exists() for arg in args)
    if lanes_wanted() < 2 or names_tests:  # `make test PYTEST_ARGS=tests/x.py`: that alone
        test_lanes = [[[*pytest, *args]]]
    else:
        test_lanes = [[[*pytest, *lane, *args]] for lane in parts()]
    if not checks and len(test_lanes) == 1:
        return subprocess.call(test_lanes[0][0], env=test_environment())
    started = time.monotonic()
    lanes = [Lane(f"lane{number}", commands) for number, commands in enumerate(test_lanes, start=1)]
    if checks:
        lanes.append(Lane("checks", [[tool(command[0]), *command[1:]] for command in CHECKS]))
    for lane in lanes:
        lane.start()
    try:
        for lane in lanes:
            lane.join()
            print(f"[{lane.name}] exit {lane.code} after {time.monotonic() - started:.0f} s", flush=True)
    except KeyboardInterrupt:
        for lane in lanes:
            if lane.process is not None:
                lane.process.terminate()
        raise
    failed = {lane.name: lane.code for lane in lanes if lane.code != 0}
    print(f"test lanes: {'all passed' if not failed else f'failed: {failed}'} in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
