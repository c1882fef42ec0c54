"""The request-size caps of the server a request reached (`wire.sizes.BodyLimits`)."""

from __future__ import annotations

from fastapi import Request

from modelpool.wire.sizes import BodyLimits


def limits_of(request: Request) -> BodyLimits:
    """The caps of the server that `request` reached."""
    return BodyLimits.of(request.app.state.config.server)
