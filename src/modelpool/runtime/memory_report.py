"""The pool's memory as `/v1/admin/memory` shows it: the process's RSS taken apart
(baseline, runtimes, models, the rest), each model's measured and estimated memory, the
GPUs, and the budgets with what is left of them for models."""

from __future__ import annotations

from modelpool.capabilities import Locality
from modelpool.runtime.adapters import adapter_bytes
from modelpool.runtime.capacity import Capacity
from modelpool.runtime.gpu_probe import nvml_processes, probe_gpus, used_bytes
from modelpool.runtime.memory import system_memory
from modelpool.runtime.memory_accounts import MemoryAccounts
from modelpool.runtime.slot import ModelSlot
from modelpool.status import BudgetStatus, GpuAccount, ModelGpu, ModelMemory, PoolMemory, ProcessMemory


def pool_memory(slots: list[ModelSlot], capacity: Capacity) -> PoolMemory:
    accounts = capacity.accounts or MemoryAccounts()
    models = {slot.id: model_memory(slot) for slot in slots}
    gpus = probe_gpus()
    return PoolMemory(
        system=system_memory(),
        gpus=gpus,
        budget=budget_status(capacity),
        models=models,
        process=process_memory(accounts, models),
        runtimes=dict(accounts.runtimes),
        gpu=GpuAccount(
            accounts.gpu_at_start, used_bytes(gpus), sum(m.measured_gpu_bytes for m in models.values()),
            sum(accounts.gpu_runtimes.values()),
        ) if accounts.gpu is not None else None,
        gpu_models=gpu_models(slots) if gpus else [],
    )  # fmt: skip


def gpu_models(slots: list[ModelSlot]) -> list[ModelGpu]:
    """Every model's GPU row, its engine processes found in one reading of NVML's lists."""
    seen = nvml_processes()
    rows = []
    for slot in slots:
        estimate = slot.record.estimate
        rows.append(ModelGpu(
            slot.id, slot.state.value, estimate.gpu_bytes if estimate else None, slot.gpu_bytes(),
            slot.replicas.gpu_uses(seen),
        ))  # fmt: skip
    return rows


def model_memory(slot: ModelSlot) -> ModelMemory:
    estimate = slot.record.estimate
    return ModelMemory(
        state=slot.state.value,
        memory_bytes=slot.memory_bytes(),
        measured_bytes=slot.replicas.measured_bytes(),
        estimate_bytes=estimate.ram_bytes if estimate else None,
        gpu_memory_bytes=slot.gpu_bytes(),
        measured_gpu_bytes=slot.replicas.measured_gpu_bytes(),
        estimate_gpu_bytes=estimate.gpu_bytes if estimate else None,
        locality=slot.capabilities.declared.locality.value,
        adapters_bytes=adapter_bytes(slot),
    )


def process_memory(accounts: MemoryAccounts, models: dict[str, ModelMemory]) -> ProcessMemory:
    rss = accounts.ram.read()
    baseline = accounts.baseline_bytes
    runtimes = accounts.runtimes_bytes()
    inside = sum(m.measured_bytes for m in models.values() if m.locality == Locality.IN_PROCESS.value)
    engines = sum(m.measured_bytes for m in models.values() if m.locality == Locality.ENGINE_PROCESS.value)
    growth = rss - baseline
    return ProcessMemory(rss, baseline, growth, runtimes, inside, growth - runtimes - inside, engines)


def budget_status(capacity: Capacity) -> BudgetStatus:
    budget, models = capacity.budget, capacity.models_budget()
    ram_from, gpu_from = capacity.budget_from
    return BudgetStatus(
        budget.max_models, budget.memory_bytes, budget.gpu_bytes,
        models.memory_bytes, models.gpu_bytes, ram_from, gpu_from,
    )  # fmt: skip
