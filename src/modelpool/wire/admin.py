"""The admin API's request bodies, and a model as its status views show it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import Field

from modelpool.config.reload_diff import ConfigDiff
from modelpool.status import ModelStatus
from modelpool.wire.common import WireModel


class LoadBody(WireModel):
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Backend options for this load only (those the backend declares overridable)."""
    replicas: int | None = Field(default=None, ge=1)
    """Scale to this many replicas (at most the model's replica_max)."""


class UnloadBody(WireModel):
    drain: bool = True
    """Wait for running requests to finish; false cuts them off with 503 model_unloaded."""


def admin_model_json(status: ModelStatus) -> dict[str, Any]:
    capabilities = status.capabilities
    view = {key: value for key, value in asdict(status).items() if key not in ("capabilities", "created")}
    if status.download is not None:
        view["download"] = {**view["download"], "percent": status.download.percent}
    return {
        **view,
        "tasks": sorted(task.value for task in capabilities.tasks),
        "remote": capabilities.remote,
        "capabilities": capabilities.as_json(),
    }


def reload_json(diff: ConfigDiff) -> dict[str, Any]:
    """A config reload's reply: what it changed and how (`config/reload_diff.py`)."""
    return {
        "object": "config.reload",
        "added": list(diff.added),
        "removed": list(diff.removed),
        "reloading": [{"id": change.id, "fields": list(change.fields)} for change in diff.reloading],
        "hot": [{"id": change.id, "fields": list(change.fields)} for change in diff.hot],
        "live": list(diff.live),
        "needs_restart": list(diff.needs_restart),
        "unchanged": diff.unchanged,
    }
