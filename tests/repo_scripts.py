"""The repository's scripts/ (not a package) imported as modules, for their tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str, *, register: bool = False) -> ModuleType:
    """scripts/<name>.py as a fresh module; `register`: also in sys.modules under `name` (a
    script whose dataclasses or pickling look themselves up there)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
