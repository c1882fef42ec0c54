"""The `keep_alive` a request may ask for, checked against its model's config."""

from __future__ import annotations

from modelpool.config.schema import ModelConfig
from modelpool.errors import PermissionDenied
from modelpool.pool_api.call import CallOptions


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
