"""What routes need from the app, looked up per request (no module globals)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from fastapi import Request

from modelpool.runtime.pool import ModelPool


def pool_of(request: Request) -> ModelPool:
    pool: ModelPool = request.app.state.pool
    return pool


def wants_metrics(request: Request, asked: bool) -> bool:
    """Timing metrics go into a response when the request asks or the server config says so."""
    return asked or bool(request.app.state.config.server.timing_metrics)


def note_model(request: Request, model: str) -> None:
    """Label this request's metrics and access-log line with the model it asked for."""
    request.state.model_id = model


@dataclass(frozen=True)
class ResponseMeta:
    """id/created/model of one response, shared by all its stream chunks."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseMeta:
        return cls(id=f"{prefix}-{secrets.token_hex(12)}", model=model)
