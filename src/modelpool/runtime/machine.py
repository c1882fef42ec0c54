"""How much memory this machine gives modelpool: the RAM it has, or the cgroup's limit when
that is lower (a container, a systemd slice). Paths are injectable so tests use fake files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
_NO_LIMIT_V1 = 1 << 60
"""cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages), not "max"."""


@dataclass(frozen=True)
class MachineMemory:
    total_bytes: int
    """What modelpool may use: the RAM, or the cgroup limit when lower."""
    source: str
    """Where total_bytes comes from: "RAM" or "cgroup limit"."""


def machine_memory(ram_bytes: int | None = None, cgroup_root: Path = CGROUP_ROOT,
                   self_cgroup: Path = SELF_CGROUP) -> MachineMemory:  # fmt: skip
    ram = int(psutil.virtual_memory().total) if ram_bytes is None else ram_bytes
    limit = cgroup_limit(cgroup_root, self_cgroup)
    if limit is not None and limit < ram:
        return MachineMemory(limit, "cgroup limit")
    return MachineMemory(ram, "RAM")


def cgroup_limit(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors (v2
    `memory.max`, or v1 `memory.limit_in_bytes`); None when there is none or no cgroup fs."""
    limits = [limit for folder in _cgroup_folders(root, self_cgroup) if (limit := _read_limit(folder)) is not None]
    return min(limits, default=None)


def _cgroup_folders(root: Path, self_cgroup: Path) -> list[Path]:
    """The process's cgroup folder and every ancestor up to the root, for v2 (`0::/path`)
    and v1's memory controller (`N:memory:/path`)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return [root, root / "memory"]
    folders: list[Path] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            base = root
        elif "memory" in controllers.split(","):
            base = root / "memory"
        else:
            continue
        here = base / path.strip("/")
        folders.extend([here, *[p for p in here.parents if p.is_relative_to(base)]])
    return folders or [root, root / "memory"]


def _read_limit(folder: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (folder / name).read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= _NO_LIMIT_V1:
            return None
        return int(text)
    return None
