"""Request bodies of the admin API."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from modelpool.api.schemas.common import WireModel


class LoadBody(WireModel):
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Backend options for this load only (those the backend declares overridable)."""
    replicas: int | None = Field(default=None, ge=1)
    """Scale to this many replicas (at most the model's replica_max)."""


class UnloadBody(WireModel):
    drain: bool = True
    """Wait for running requests to finish; false cuts them off with 503 model_unloaded."""
