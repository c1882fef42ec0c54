"""A memory budget as people write it: bytes (`8GiB`, `512MB`, 8589934592), a share of
the machine (`75%`), or `none` for no limit. Percentages stay text ("75%") until the pool
knows how much memory the machine has; everything else becomes bytes here."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, ByteSize, TypeAdapter

_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)\s*%$")
_OFF = frozenset({"none", "off", "unlimited", "no"})
_BYTES: TypeAdapter[ByteSize] = TypeAdapter(ByteSize)
_HELP = "a memory budget is bytes ('8GiB', '512MB'), a share of the machine ('75%') or 'none'"


def parse_share(value: Any) -> int | str | None:
    """Bytes as an int, a percentage as its normalised text ("75%"), or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(_HELP)
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError(f"{_HELP}; a number of bytes must be positive")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(_HELP)
    text = value.strip().lower()
    if text in _OFF:
        return None
    percent = _PERCENT.match(text)
    if percent:
        share = float(percent.group(1))
        if not 0 < share <= 100:
            raise ValueError(f"'{value}': a memory budget's share of the machine is above 0% and at most 100%")
        return f"{share:g}%"
    try:
        size = int(_BYTES.validate_python(text))
    except ValueError:
        raise ValueError(f"'{value}' is not a memory budget ({_HELP})") from None
    if size <= 0:
        raise ValueError(f"{_HELP}; a number of bytes must be positive")
    return size


def share_of(setting: int | str | None, total: int) -> int | None:
    """The bytes a parsed setting allows out of `total` (None: no limit)."""
    if setting is None or isinstance(setting, int):
        return setting
    return int(total * float(setting.rstrip("%")) / 100)


MemoryShare = Annotated[int | str | None, BeforeValidator(parse_share)]
