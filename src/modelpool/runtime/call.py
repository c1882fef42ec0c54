"""What a request asks of the pool besides its own work."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallOptions:
    keep_alive: float | None = None
    """Seconds to keep the model loaded after this request (None: the model's own setting)."""
    allow_remote: bool = False
    """The caller accepts that a remote upstream serves the request (the `allow_remote` gate)."""
