"""What a slot reports: its typed status snapshot, why a request now would wait, and the
errors a request gets when a load failed or is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelpool.config.redact import redact
from modelpool.errors import ModelLoadFailed, ModelNotLoaded, ModelNotReady, ModelpoolError
from modelpool.owner import Priority
from modelpool.runtime.adapters import loaded_adapters
from modelpool.runtime.lifecycle import Decision, Refusal, SlotState
from modelpool.runtime.option_schema import override_options
from modelpool.status import MemoryStatus, ModelStatus

if TYPE_CHECKING:  # the slot builds its snapshots here
    from modelpool.runtime.slot import ModelSlot


def status_of(slot: ModelSlot) -> ModelStatus:
    config, record = slot.config, slot.record
    now = slot.clock.monotonic()
    return ModelStatus(
        id=slot.id, created=slot.created, state="downloading" if slot.download else slot.state.value,
        backend=config.backend,
        capabilities=slot.capabilities, aliases=list(config.aliases), description=config.description,
        owned_by=config.owned_by, replicas=slot.replicas.statuses(), replicas_wanted=config.replicas,
        replica_max=config.replica_max, in_flight=slot.admission.running, queued=slot.admission.waiting,
        queued_by_priority={p.value: slot.admission.waiting_in(p) for p in Priority},
        max_concurrency=config.max_concurrency, max_queue=config.max_queue,
        memory=MemoryStatus(
            estimate_bytes=record.estimate.ram_bytes if record.estimate else None,
            estimate_gpu_bytes=record.estimate.gpu_bytes if record.estimate else None,
            measured_bytes=slot.replicas.measured_bytes(),
            counted_bytes=slot.memory_bytes(),
            counted_gpu_bytes=slot.gpu_bytes(),
            measured_gpu_bytes=slot.replicas.measured_gpu_bytes(),
        ),
        keep_alive_s=config.keep_alive,
        expires_in_s=None if slot.expires_at is None else round(max(0.0, slot.expires_at - now), 3),
        pinned=config.pinned, autoload=config.autoload, loaded_at=record.loaded_at,
        load_seconds=record.load_seconds, last_error=record.error, crashes_in_a_row=slot.crashes.in_a_row,
        allow_remote=config.allow_remote, options=redact(config.options),
        overridable=sorted(slot.capabilities.overridable),
        override_options=override_options(config, slot.capabilities.overridable),
        download=slot.download.status() if slot.download else None, dimensions=slot.dimensions,
        adapters=list(config.adapters), adapters_loaded=loaded_adapters(slot),
    )  # fmt: skip


def readiness_problem_of(slot: ModelSlot) -> ModelpoolError | None:
    """Why a request now would not be served without waiting for a load: None when the
    model is ready or would load on demand (unloaded, autoload on, not failed)."""
    if slot.state is SlotState.FAILED:
        return ModelLoadFailed(f"model '{slot.id}' failed to load: {slot.record.error}",
                               retry_after_s=slot.config.retry_cooldown_s)  # fmt: skip
    if slot.download is not None:
        return slot.download.not_ready(slot.id)
    if slot.state is SlotState.LOADING:
        return ModelNotReady(f"model '{slot.id}' is loading")
    if slot.state is not SlotState.READY and not slot.config.autoload:
        return ModelNotReady(f"model '{slot.id}' is not loaded and has autoload off (`modelpool load {slot.id}`)")
    return None


def load_error_of(slot: ModelSlot, exc: BaseException) -> BaseException:
    """What a load's failure becomes for the requests that waited on it."""
    if isinstance(exc, ModelpoolError):
        return exc
    if isinstance(exc, Exception):
        return ModelLoadFailed(
            f"model '{slot.id}' failed to load: {slot.record.error}", retry_after_s=slot.config.retry_cooldown_s
        )
    return exc  # cancellation and friends pass through untouched


def refusal_of(slot: ModelSlot, decision: Decision) -> ModelpoolError:
    """The error a request gets when the slot's lifecycle refuses to load the model."""
    if decision.refusal is Refusal.NOT_LOADED:
        return ModelNotLoaded(
            f"model '{slot.id}' is not loaded and has autoload off; an admin must load it first "
            f"(`modelpool load {slot.id}`)",
            param="model",
        )
    if decision.refusal is Refusal.GAVE_UP:
        return ModelLoadFailed(
            f"model '{slot.id}' crashed {slot.crashes.in_a_row} times in a row, so modelpool stopped "
            f"restarting it (`modelpool load {slot.id}` tries again). Last crash: {slot.record.error}",
            retry_after_s=decision.retry_after_s,
        )
    return ModelLoadFailed(
        f"model '{slot.id}' failed to load: {slot.record.error} (next try in {decision.retry_after_s:.0f}s)",
        retry_after_s=decision.retry_after_s,
    )
