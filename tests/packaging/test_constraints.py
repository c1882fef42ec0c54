"""constraints.txt pins what `make install` and CI install, and it is the lock of this very
environment: a dependency added without `make lock`, or a release slipping in, fails here."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement

from tests.repo_scripts import load_script

if sys.version_info >= (3, 11):
    import tomllib

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"


def lock_script() -> ModuleType:
    return load_script("lock")


def pinned() -> dict[str, str]:
    lines = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("==", 1) for line in lines)


def test_every_installed_distribution_is_pinned_at_its_version() -> None:
    if importlib.util.find_spec("ray") is not None:  # imported, Ray puts its vendored packages on sys.path:
        importlib.import_module("ray")  # they are not installed distributions, whatever ran before this test
    lock = lock_script()
    installed, pins = lock.pins(), pinned()
    assert {name: version for name, version in installed.items() if pins.get(name) != version} == {}
    assert set(pins) - set(installed) == set(), "pins of packages nothing installs: run `make lock`"


def test_the_lock_script_writes_exactly_the_committed_file() -> None:
    lock = lock_script()
    assert lock.render(lock.pins()) == CONSTRAINTS.read_text()


def test_torch_and_modelpool_are_left_to_their_own_specs() -> None:
    assert {"torch", "modelpool"} & set(pinned()) == set()


def test_the_pins_satisfy_every_requirement_the_project_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra, requirements in project["optional-dependencies"].items():
        if extra != "all":
            declared += [r for r in requirements if not r.startswith("modelpool[")]
    pins = pinned()
    unmet = []
    for text in declared:
        requirement = Requirement(text)
        version = pins.get(lock_script().canonical(requirement.name))
        if version is not None and not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{text} (pinned {version})")
    assert unmet == []


def test_every_pip_install_of_the_test_install_uses_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if re.search(r"\$\(BIN\)/(python -m )?pip install", line)]
    # The one exception: the llama-cpp-python wheel just built, installed alone (--no-deps).
    unconstrained = [line.strip() for line in installs if "$(PIP_C)" not in line and "$(LLAMA_WHEELS)/" not in line]
    assert len(installs) >= 6
    assert unconstrained == []


def test_make_lock_freezes_a_fresh_unconstrained_install() -> None:
    shown = subprocess.run(
        ["make", "-n", "lock"], cwd=ROOT, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}
    ).stdout
    assert "install-test VENV=.venv-lock CONSTRAINTS=" in shown
    assert ".venv-lock/bin/python scripts/lock.py > constraints.txt" in shown
