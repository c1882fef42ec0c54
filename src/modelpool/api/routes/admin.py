"""The admin API: see and steer the pool (load, unload, scale, memory). Admin scope.
Every view is a runtime status snapshot, rendered here."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from modelpool.api.deps import note_model, pool_of
from modelpool.api.usage import MAX_UNIX_TIME, WINDOW_RULE, usage_json, usage_row_json
from modelpool.config.schema import ADAPTER_NAME_PATTERN
from modelpool.errors import InvalidRequest, ReloadUnavailable
from modelpool.pool_api.reload import ConfigReload
from modelpool.pool_api.usage import UsageHistory
from modelpool.wire.admin import LoadBody, UnloadBody, admin_model_json, reload_json
from modelpool.wire.contract import LISTING_ERRORS, POOL_ERRORS, declared

router = APIRouter(prefix="/v1/admin")


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [admin_model_json(s) for s in pool_of(request).statuses()]})


@router.get("/models/{model_id:path}/status", responses=declared(LISTING_ERRORS))
async def model_status(model_id: str, request: Request) -> JSONResponse:
    return JSONResponse(admin_model_json(pool_of(request).status(model_id)))


@router.get("/models/{model_id:path}/logs", responses=declared(LISTING_ERRORS))
async def model_logs(model_id: str, request: Request, lines: int = Query(default=200, ge=1, le=10_000)) -> JSONResponse:
    """The last output of the model's engine processes, and of the process that crashed last."""
    logs = await pool_of(request).engine_logs(model_id, lines)
    crash = {"error": logs.last_crash_error, "lines": logs.last_crash_lines} if logs.last_crash_lines else None
    processes = [asdict(output) for output in logs.processes]
    return JSONResponse({"model": logs.model, "state": logs.state, "processes": processes, "last_crash": crash})


ADAPTER = Path(pattern=ADAPTER_NAME_PATTERN, description="One of the model's declared `adapters:`, by name.")


# Before `/models/{model_id:path}/load`, whose path would take `m/adapters/a` for a model id.
@router.post("/models/{model_id:path}/adapters/{adapter}/load", responses=declared(POOL_ERRORS))
async def load_adapter(model_id: str, request: Request, adapter: Annotated[str, ADAPTER]) -> JSONResponse:
    """Load a declared LoRA adapter into the running model now (a request would on first use)."""
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.load_adapter(model_id, adapter)
    return JSONResponse(admin_model_json(pool.status(model_id)))


@router.post("/models/{model_id:path}/adapters/{adapter}/unload", responses=declared(POOL_ERRORS))
async def unload_adapter(model_id: str, request: Request, adapter: Annotated[str, ADAPTER]) -> JSONResponse:
    """Unload an idle adapter (429 while a running request uses it)."""
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.unload_adapter(model_id, adapter)
    return JSONResponse(admin_model_json(pool.status(model_id)))


@router.post("/models/{model_id:path}/load", responses=declared(POOL_ERRORS, rules=(
    "replicas at most the model's replica_max", "overrides name only options its backend lets a load change")))
async def load_model(model_id: str, request: Request, body: LoadBody | None = None) -> JSONResponse:
    body = body or LoadBody()
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.load(model_id, overrides=body.overrides, replicas=body.replicas)
    return JSONResponse(admin_model_json(pool.status(model_id)))


@router.post("/models/{model_id:path}/unload", responses=declared(POOL_ERRORS))
async def unload_model(model_id: str, request: Request, body: UnloadBody | None = None) -> JSONResponse:
    body = body or UnloadBody()
    note_model(request, model_id)
    pool = pool_of(request)
    await pool.unload(model_id, drain=body.drain)
    return JSONResponse(admin_model_json(pool.status(model_id)))


@router.post("/reload", responses=declared((400, 409)))
async def reload_config(request: Request) -> JSONResponse:
    """Re-read the config from the sources the server started from and apply the
    difference; 400 `invalid_config` (nothing changed) when the re-read config is invalid."""
    reloader: ConfigReload | None = request.app.state.reloader
    if reloader is None:
        raise ReloadUnavailable(
            "this server cannot re-read its config: it was not started by `modelpool serve` "
            "(in Ray mode, redeploy with `modelpool ray deploy`)"
        )
    return JSONResponse(reload_json(await reloader.reload("api")))


@router.get("/memory")
async def memory(request: Request) -> JSONResponse:
    return JSONResponse(asdict(pool_of(request).memory()))


@router.get("/usage", responses=declared((400,), rules=(WINDOW_RULE,)))
async def usage(
    request: Request,
    start_time: Annotated[int | None, Query(ge=0, le=MAX_UNIX_TIME)] = None,
    end_time: Annotated[int | None, Query(ge=0, le=MAX_UNIX_TIME)] = None,
    group_by: Annotated[Literal["key", "model"], Query()] = "key",
) -> JSONResponse:
    """Usage per API key (since start, or all that `usage_store` kept), with its rate
    limits and what is left of them; `windowed` rows for the hours from `start_time` to
    `end_time` (unix seconds) per key or per key and model, read from `usage_store`."""
    reports = request.app.state.rate_limiter.report(request.app.state.usage)
    body: dict[str, Any] = {"object": "list", "data": [usage_json(report) for report in reports]}
    history: UsageHistory | None = request.app.state.usage_history
    asked = start_time is not None or end_time is not None or group_by == "model"
    if asked and history is None:
        raise InvalidRequest(f"{WINDOW_RULE}: this server keeps no usage history.", param="start_time")
    if history is not None:
        rows = await history.query(start_time, end_time, group_by == "model")
        body["windowed"] = [usage_row_json(row) for row in rows]
    return JSONResponse(body)


@router.get("/gpu-memory")
async def gpu_memory(request: Request) -> JSONResponse:
    """The GPU part of /memory, under the name llm-pool's clients use: each GPU (NVML's
    totals), each model's estimate and measured use by replica (with the engine PIDs), and
    the GPU budget."""
    memory = pool_of(request).memory()
    budget = {"gpu_memory_bytes": memory.budget.gpu_memory_bytes,
              "models_gpu_memory_bytes": memory.budget.models_gpu_memory_bytes,
              "gpu_memory_from": memory.budget.gpu_memory_from}  # fmt: skip
    return JSONResponse({
        "object": "list", "available": bool(memory.gpus), "gpus": [asdict(gpu) for gpu in memory.gpus],
        "models": [asdict(model) for model in memory.gpu_models], "budget": budget,
    })  # fmt: skip
