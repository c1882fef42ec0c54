"""The admin API: see and steer the pool (load, unload, scale, memory). Admin scope."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of
from modelpool.api.schemas.admin import LoadBody, UnloadBody
from modelpool.backends.base import ProcessBackend
from modelpool.backends.registry import backend_class
from modelpool.config.redact import redact
from modelpool.errors import InvalidRequest
from modelpool.runtime.memory import gpu_memory, system_memory
from modelpool.runtime.pool import ModelPool
from modelpool.runtime.slot import ModelSlot

router = APIRouter(prefix="/v1/admin")


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    pool = pool_of(request)
    return JSONResponse({"object": "list", "data": [admin_model_json(pool, s) for s in pool.slots()]})


@router.get("/models/{model_id:path}/status")
async def model_status(model_id: str, request: Request) -> JSONResponse:
    pool = pool_of(request)
    return JSONResponse(admin_model_json(pool, pool.slot(model_id)))


@router.get("/models/{model_id:path}/logs")
async def model_logs(model_id: str, request: Request, lines: int = Query(default=200, ge=1, le=10_000)) -> JSONResponse:
    """The last output of the model's engine processes, and of the process that crashed last."""
    pool = pool_of(request)
    slot = pool.slot(model_id)
    if not hasattr(backend_class(slot.config.backend), "log_tail"):
        raise InvalidRequest(
            f"model '{slot.id}' runs inside modelpool (backend '{slot.config.backend}'); its output is "
            "modelpool's own log",
            param="model",
        )
    output = slot.crashes.last_output
    crash = {"error": slot.error, "lines": output[-lines:]} if output else None
    return JSONResponse(
        {"model": slot.id, "state": slot.state.value, "processes": slot.logs(lines), "last_crash": crash}
    )


@router.post("/models/{model_id:path}/load")
async def load_model(model_id: str, request: Request, body: LoadBody | None = None) -> JSONResponse:
    body = body or LoadBody()
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.load(model_id, overrides=body.overrides, replicas=body.replicas)
    return JSONResponse(admin_model_json(pool, pool.slot(model_id)))


@router.post("/models/{model_id:path}/unload")
async def unload_model(model_id: str, request: Request, body: UnloadBody | None = None) -> JSONResponse:
    body = body or UnloadBody()
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.unload(model_id, drain=body.drain)
    return JSONResponse(admin_model_json(pool, pool.slot(model_id)))


@router.get("/memory")
async def memory(request: Request) -> JSONResponse:
    pool = pool_of(request)
    models = {
        s.id: {
            "state": s.state.value,
            "memory_bytes": s.memory_bytes(),
            "measured_bytes": sum(r.memory_bytes for r in s.replicas),
        }
        for s in pool.slots()
    }
    budget = {
        "max_loaded_models": pool.budget.max_models,
        "memory_bytes": pool.budget.memory_bytes,
        "gpu_memory_bytes": pool.budget.gpu_bytes,
    }
    gpus = [{"device": g.device, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes} for g in gpu_memory()]
    return JSONResponse({"system": system_memory(), "gpus": gpus, "budget": budget, "models": models})


def admin_model_json(pool: ModelPool, slot: ModelSlot) -> dict[str, Any]:
    config = slot.config
    now = pool.clock.monotonic()
    return {
        "id": slot.id,
        "state": slot.state.value,
        "backend": config.backend,
        "tasks": sorted(t.value for t in slot.tasks),
        "aliases": config.aliases,
        "replicas": [
            {
                "index": r.index,
                "running": r.running,
                "served": r.served,
                "memory_bytes": r.memory_bytes,
                "retiring": r.retiring,
                **_process_json(r.backend),
            }
            for r in slot.replicas
        ],
        "replicas_wanted": config.replicas,
        "replica_max": config.replica_max,
        "in_flight": slot.admission.running,
        "queued": slot.admission.waiting,
        "max_concurrency": config.max_concurrency,
        "max_queue": config.max_queue,
        "memory": {
            "estimate_bytes": slot.estimate.ram_bytes if slot.estimate else None,
            "estimate_gpu_bytes": slot.estimate.gpu_bytes if slot.estimate else None,
            "measured_bytes": sum(r.memory_bytes for r in slot.replicas),
            "counted_bytes": slot.memory_bytes(),
            "counted_gpu_bytes": slot.gpu_bytes(),
        },
        "keep_alive_s": config.keep_alive,
        "expires_in_s": None if slot.expires_at is None else round(max(0.0, slot.expires_at - now), 3),
        "pinned": config.pinned,
        "autoload": config.autoload,
        "loaded_at": slot.loaded_at,
        "load_seconds": slot.load_seconds,
        "last_error": slot.error,
        "crashes_in_a_row": slot.crashes.in_a_row,
        "remote": slot.remote,
        "allow_remote": config.allow_remote,
        "options": redact(config.options),
        "overridable": sorted(backend_class(config.backend).overridable),
    }


def _process_json(backend: object) -> dict[str, Any]:
    if not isinstance(backend, ProcessBackend):
        return {}
    return {"pid": backend.pid, "port": getattr(backend, "port", None)}
