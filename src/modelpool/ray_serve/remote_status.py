"""What the Ray ingress reports from its merged view of the replicas: readiness (as a slot
and as the pool in one process answer it) and memory."""

from __future__ import annotations

from modelpool.config.schema import Config, ModelConfig
from modelpool.errors import ModelLoadFailed, ModelNotReady, ModelpoolError
from modelpool.runtime.eviction import Budget
from modelpool.runtime.memory import system_memory
from modelpool.status import BudgetStatus, ModelMemory, ModelStatus, PoolMemory


def readiness_of(config: Config, statuses: list[ModelStatus], *, closing: bool) -> tuple[bool, dict[str, str]]:
    """(ready, model → state) where ready means every model that loads as its replicas start is ready."""
    states = {status.id: status.state for status in statuses}
    preloaded = {model.id for model in config.served_models() if _starts_loaded(model)}
    ready = not closing and all(states[model] == "ready" for model in preloaded)
    return ready, states


def model_readiness_problem(status: ModelStatus) -> ModelpoolError | None:
    """As a slot answers: None when ready or loading on demand."""
    if status.state == "failed":
        return ModelLoadFailed(f"model '{status.id}' failed to load: {status.last_error}")
    if status.state == "loading":
        return ModelNotReady(f"model '{status.id}' is loading")
    if status.state != "ready" and not status.autoload:
        return ModelNotReady(f"model '{status.id}' is not loaded and has autoload off")
    return None


def pool_readiness_problem(ready: bool, states: dict[str, str]) -> ModelpoolError | None:
    if ready:
        return None
    waiting = ", ".join(f"'{model}' ({state})" for model, state in states.items() if state != "ready")
    return ModelNotReady(f"waiting for preloaded models: {waiting}")


def memory_of(statuses: list[ModelStatus], budget: Budget) -> PoolMemory:
    models = {
        status.id: ModelMemory(status.state, sum(r.memory_bytes for r in status.replicas), status.memory.measured_bytes)
        for status in statuses
    }
    return PoolMemory(
        system=system_memory(),
        gpus=[],
        budget=BudgetStatus(budget.max_models, budget.memory_bytes, budget.gpu_bytes),
        models=models,
    )


def _starts_loaded(model: ModelConfig) -> bool:
    """Readiness waits for models that load when their replicas start (not grouped ones,
    which load on demand, nor ones that scale from zero)."""
    if not model.preload:
        return False
    ray = model.ray
    if ray is None:
        return True
    if ray.group is not None:
        return False
    return ray.autoscaling is None or ray.autoscaling.min_replicas > 0
