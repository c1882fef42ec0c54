"""A model as GET /v1/models lists it: OpenAI's fields plus state, tasks, aliases and the
model's `capabilities`, so a client can decide from data what to send; while its weights
download (state "downloading"), `download` says how far (bytes done/total)."""

from __future__ import annotations

from typing import Any

from modelpool.status import DownloadStatus, ModelStatus


def models_json(statuses: list[ModelStatus]) -> dict[str, Any]:
    """OpenAI's list (`data`), plus `models`: the same ids alone, as llm-pool's clients read
    its `/v1/models` (`{"models": [ids]}`); an extra field OpenAI's clients ignore."""
    data = [entry for s in statuses for entry in (model_json(s), *adapter_entries(s))]
    return {"object": "list", "data": data, "models": [s.id for s in statuses]}


def adapter_entries(status: ModelStatus) -> list[dict[str, Any]]:
    """Each LoRA adapter as a model of its own, `<id>:<adapter>` with its base as `parent`
    (as vLLM lists adapters); it shares the base's state, tasks and capabilities."""
    base = model_json(status)
    shown = []
    for name in status.adapters:
        entry = {**base, "id": f"{status.id}:{name}", "parent": status.id, "aliases": [], "adapter": name}
        shown.append(entry)
    return shown


def model_json(status: ModelStatus) -> dict[str, Any]:
    capabilities = status.capabilities.as_json()
    shown = {
        "id": status.id,
        "object": "model",
        "created": status.created,
        "owned_by": status.owned_by,
        "state": status.state,
        "tasks": capabilities["tasks"],
        "aliases": status.aliases,
        "backend": status.backend,
        "description": status.description,
        "languages": capabilities["languages"],
        "capabilities": capabilities,
        "error": status.last_error,
    }
    if "embedding" in capabilities["tasks"]:  # the simple inference server lists it; None until known
        shown["dimensions"] = status.dimensions
    if status.download is not None:  # state "downloading": how far the weights are
        shown["download"] = download_json(status.download)
    return shown


def download_json(download: DownloadStatus) -> dict[str, Any]:
    return {
        "done_bytes": download.done_bytes,
        "total_bytes": download.total_bytes,
        "percent": download.percent,
        "file": download.file,
        "seconds": download.seconds,
    }
