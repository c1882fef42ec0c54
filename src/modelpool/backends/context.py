"""What a backend is given besides its own config: where files live, which tasks it serves,
and the state that the pool owns and shares among its backends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from modelpool.config.sources import HubLocation
from modelpool.status import GpuMemory
from modelpool.tasks import Task


def no_gpus() -> list[GpuMemory]:
    return []


class ClaimedProcesses:
    """Engine processes that backends of this pool have adopted or started: two replicas
    never adopt the same persistent process. One per pool (a second pool in the same Python
    process, as tests make, has its own)."""

    def __init__(self) -> None:
        self._pids: set[int] = set()

    def claim(self, pid: int) -> None:
        self._pids.add(pid)

    def release(self, pid: int) -> None:
        self._pids.discard(pid)

    def __contains__(self, pid: object) -> bool:
        return pid in self._pids


@dataclass(frozen=True)
class BackendContext:
    hub: HubLocation = field(default_factory=HubLocation)
    tasks: frozenset[Task] = frozenset()
    """What this model serves (resolved from its config and its backend's capabilities)."""
    claimed: ClaimedProcesses = field(default_factory=ClaimedProcesses)
    gpus: Callable[[], list[GpuMemory]] = no_gpus
    """The GPUs the pool sees now (NVML's totals): an engine that takes a share of each GPU
    (vLLM's `gpu_memory_utilization`) is estimated from them before it starts."""
