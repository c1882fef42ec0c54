"""Durations as people write them: 300, "30s", "5m", "1h30m", "250ms"; -1 means forever."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

FOREVER = -1.0
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> float:
    """Seconds as a float; any negative value means forever (-1)."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text like '5m'")
    if isinstance(value, int | float):
        return FOREVER if value < 0 else float(value)
    if not isinstance(value, str):
        raise ValueError("a duration is a number of seconds or text like '5m'")
    text = value.strip().lower()
    if _is_number(text):
        return parse_duration(float(text))
    if text.startswith("-"):
        return FOREVER
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"'{value}' is not a duration (examples: 30, '45s', '5m', '1h30m', -1)")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


Duration = Annotated[float, BeforeValidator(parse_duration)]
