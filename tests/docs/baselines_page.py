"""docs/baselines.md's fenced blocks, read the way the page's tests use them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

PAGE = Path(__file__).resolve().parents[2] / "docs" / "baselines.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(PAGE.read_text()) if lang == language]


def ab_config() -> dict[str, object]:
    """The page's A/B config: the block that serves exactly the two baselines."""
    (found,) = [c for c in map(yaml.safe_load, blocks("yaml")) if "enabled_models" in c]
    assert isinstance(found, dict)
    return found
