"""What a request asks of the pool besides its own work."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelpool.owner import Schedule, caller_schedule


@dataclass(frozen=True)
class CallOptions:
    keep_alive: float | None = None
    """Seconds to keep the model loaded after this request (None: the model's own setting)."""
    allow_remote: bool = False
    """The caller accepts that a remote upstream serves the request (the `allow_remote` gate)."""
    may_shorten_keep_alive: bool = True
    """The caller may ask for a `keep_alive` shorter than the model's configured one, which
    can unload a pinned or `autoload: false` model: over HTTP, a key with the admin scope
    (or any caller of a server without keys); the pool used as a library may."""
    schedule: Schedule = field(default_factory=caller_schedule)
    """The request's class and fair-share party in the model's queue: by default the
    caller's (its key's `priority` and `weight`, set by the key middleware) when built
    inside a request. Background work names its own, e.g. the Batch API's
    `Schedule(f"batch {key}", Priority.LOW)`."""


DEFAULT_CALL = CallOptions()
