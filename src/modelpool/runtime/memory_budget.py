"""The pool's memory budgets in bytes, from the config's settings (bytes, a share, or none)
and what the machine has, and the start-up line that says them."""

from __future__ import annotations

from dataclasses import dataclass

from modelpool.config.memory_share import share_of
from modelpool.config.schema import PoolConfig
from modelpool.runtime.machine import MachineMemory
from modelpool.status import GpuMemory

GiB = 1024**3


@dataclass(frozen=True)
class MemoryBudgets:
    ram_bytes: int | None
    """All the RAM modelpool may use (baseline, runtimes and models); None: no limit."""
    ram_from: str
    """How ram_bytes was reached, for people: "75% of 23.5 GiB of RAM", "set to 8.0 GiB"."""
    gpu_bytes: int | None
    """All the GPU memory the pool may count (what was in use at start included); None: no limit."""
    gpu_from: str


def resolve_budgets(pool: PoolConfig, machine: MachineMemory, gpus: list[GpuMemory]) -> MemoryBudgets:
    ram = share_of(pool.memory_budget_bytes, machine.total_bytes)
    where = "of RAM" if machine.source == "RAM" else f"({machine.source}, below the RAM)"
    ram_from = _described(pool.memory_budget_bytes, machine.total_bytes, where)
    gpu_total = sum(gpu.total_bytes for gpu in gpus)
    gpu_setting = pool.gpu_memory_budget_bytes
    if isinstance(gpu_setting, str) and not gpus:
        return MemoryBudgets(ram, ram_from, None, "no GPU seen")  # a share of nothing: no GPU budget
    gpu = share_of(gpu_setting, gpu_total)
    plural = "s" if len(gpus) > 1 else ""
    return MemoryBudgets(ram, ram_from, gpu, _described(gpu_setting, gpu_total, f"of {len(gpus)} GPU{plural}"))


def _described(setting: int | str | None, total: int, of_what: str) -> str:
    if setting is None:
        return "no limit"
    if isinstance(setting, int):
        return f"set to {_gib(setting)}"
    return f"{setting} of {_gib(total)} {of_what}"


def _gib(size: int) -> str:
    return f"{size / GiB:.1f} GiB"


def startup_lines(budgets: MemoryBudgets) -> list[str]:
    """What the server says at start about its budgets, with how to change them."""
    if budgets.ram_bytes is None:
        ram = "memory budget: none (set pool.memory_budget_bytes to bytes or a share like 75% to have one)"
    else:
        ram = (
            f"memory budget {_gib(budgets.ram_bytes)} ({budgets.ram_from}); "
            "set pool.memory_budget_bytes to change it, `none` for no limit"
        )
    lines = [ram]
    if budgets.gpu_bytes is not None:
        lines.append(
            f"GPU memory budget {_gib(budgets.gpu_bytes)} ({budgets.gpu_from}); "
            "set pool.gpu_memory_budget_bytes to change it, `none` for no limit"
        )
    elif budgets.gpu_from != "no GPU seen":
        lines.append("GPU memory budget: none")
    return lines
