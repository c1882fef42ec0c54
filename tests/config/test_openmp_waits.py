"""The OpenMP wait settings a serving process gives itself (`config.environment.OPENMP_WAITS`):
in its environment before an engine loads OpenMP, the operator's own kept, and never handed
on to the processes it starts. Each case runs in a fresh interpreter, where no engine has
loaded OpenMP yet (this test process may well have)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelpool.config import environment
from modelpool.config.environment import OPENMP_WAITS, apply_openmp_waits

WAIT_NAMES = tuple(OPENMP_WAITS)
RECORD_ENGINE_LOADS = """
import json, os, sys
loads = []
def record(event, args):
    if event == "ctypes.dlopen" and args and args[0]:
        loads.append([str(args[0]), {name: os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}])
sys.addaudithook(record)
from modelpool.cli.main import app
try:
    code = app(sys.argv[1:], standalone_mode=False)
except SystemExit as exit:
    code = exit.code
gomp = any("libgomp" in line for line in open("/proc/self/maps"))
print(json.dumps({"code": code, "loads": loads, "gomp": gomp}))
"""


def fresh_python(code: str, *argv: str, env: dict[str, str] | None = None) -> str:
    clean = {name: value for name, value in os.environ.items() if name not in WAIT_NAMES}
    done = subprocess.run([sys.executable, "-c", code, *argv], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP's settings: Linux only")
def test_serve_sets_them_before_the_engine_loads_its_libraries(tmp_path: Path) -> None:
    """`modelpool serve` (here `--dry-run`, the same command up to the listening) on the starter
    chat model: when llama.cpp's libraries are opened, the settings are already there."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "enabled_models": ["smollm2-135m-instruct"]}))
    seen = json.loads(fresh_python(RECORD_ENGINE_LOADS, "serve", "--dry-run", "-c", str(config)))
    assert seen["code"] == 0 and seen["gomp"], seen  # the model loaded, and OpenMP with it
    engine_loads = [env for library, env in seen["loads"] if "llama" in library or "ggml" in library]
    assert engine_loads, seen["loads"]
    assert all(env == OPENMP_WAITS for env in engine_loads), engine_loads


def test_the_operators_own_setting_is_kept_and_reaches_engines() -> None:
    code = """
import json, os
from modelpool.config.environment import apply_openmp_waits, engine_environment
engine = engine_environment({})
print(json.dumps([apply_openmp_waits(), os.environ.get("GOMP_SPINCOUNT"), engine.get("OMP_WAIT_POLICY")]))
"""
    assert json.loads(fresh_python(code, env={"OMP_WAIT_POLICY": "PASSIVE"})) == [{}, None, "PASSIVE"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP's settings: Linux only")
def test_what_modelpool_set_stays_out_of_engine_and_child_environments() -> None:
    """An engine given OMP_WAIT_POLICY=ACTIVE without the spin count would spin for minutes
    at every wait; a stack's service is sized by its operator, not by modelpool's threads."""
    code = """
import json, os
from modelpool.config.environment import apply_openmp_waits, child_environment, engine_environment
applied = apply_openmp_waits()
names = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
print(json.dumps([applied, [os.environ.get(n) for n in names],
                  [n for n in names if n in engine_environment({})], [n for n in names if n in child_environment({})],
                  engine_environment({"OMP_WAIT_POLICY": "PASSIVE"})["OMP_WAIT_POLICY"]]))
"""
    applied, own, engine, child, explicit = json.loads(fresh_python(code))
    assert applied == OPENMP_WAITS
    assert own == list(OPENMP_WAITS.values())
    assert engine == [] and child == []
    assert explicit == "PASSIVE"  # an engine's own `env` option still sets it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP's settings: Linux only")
def test_nothing_is_set_once_openmp_is_loaded() -> None:
    """libgomp reads them once, when it loads: setting them later would only mislead."""
    code = """
import ctypes, json, os
ctypes.CDLL("libgomp.so.1")
from modelpool.config.environment import apply_openmp_waits
print(json.dumps([apply_openmp_waits(), os.environ.get("OMP_WAIT_POLICY")]))
"""
    assert json.loads(fresh_python(code)) == [{}, None]


def test_off_linux_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Elsewhere PyTorch runs on LLVM's OpenMP, where ACTIVE means spinning without end."""
    for name in WAIT_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(environment, "openmp_loaded", lambda: False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert apply_openmp_waits() == {}
    assert not set(WAIT_NAMES) & set(os.environ)
