"""The one place outside the config loader that reads the process environment: secrets that
the config names by variable (`api_key_env: NAME`, never logged or echoed), the default
state directory, and the environment handed on to child processes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "MODELPOOL_STATE_DIR"


def secret(variable: str) -> str | None:
    """The value of the environment variable the config names for a secret (None when unset
    or empty)."""
    return os.environ.get(variable) or None


def default_state_dir() -> Path:
    """$MODELPOOL_STATE_DIR, else $XDG_STATE_HOME/modelpool, else ~/.local/state/modelpool."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "modelpool"


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    """modelpool's own environment with `extra` on top, for a process it spawns."""
    return {**os.environ, **extra}
