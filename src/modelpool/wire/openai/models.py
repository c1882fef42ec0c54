"""A model as GET /v1/models lists it: OpenAI's fields plus state, tasks, aliases and the
model's `capabilities`, so a client can decide from data what to send."""

from __future__ import annotations

from typing import Any

from modelpool.status import ModelStatus


def model_json(status: ModelStatus) -> dict[str, Any]:
    capabilities = status.capabilities.as_json()
    return {
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
