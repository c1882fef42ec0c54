"""What a request asks of the pool besides its own work."""

from __future__ import annotations

from dataclasses import dataclass

from modelpool.config.schema import ModelConfig
from modelpool.errors import PermissionDenied


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


def check_keep_alive(options: CallOptions, model: ModelConfig) -> None:
    """A request's `keep_alive` may keep its model longer, never unload it sooner than the
    config says, unless the caller may (PermissionDenied naming `keep_alive`)."""
    asked, configured = options.keep_alive, model.keep_alive
    if asked is None or options.may_shorten_keep_alive or asked < 0:
        return  # not asked, an admin, or "forever": never sooner
    if configured < 0 or asked < configured:
        kept = "never unloads it" if configured < 0 else f"keeps it {configured:g} s after a request"
        pinned = " (it is pinned)" if model.pinned else " (it does not load on demand)" if not model.autoload else ""
        raise PermissionDenied(
            f"keep_alive {asked:g} would unload model '{model.id}' sooner than its config, which {kept}{pinned}; "
            "a shorter keep_alive needs a key with the admin scope",
            param="keep_alive",
        )
