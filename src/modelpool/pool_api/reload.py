"""What the admin API asks of the server's config reloader (`server/reload.py`): re-read the
config from where it first came from and apply the difference, or say why not."""

from __future__ import annotations

from typing import Protocol

from modelpool.config.reload_diff import ConfigDiff


class ConfigReload(Protocol):
    async def reload(self, trigger: str) -> ConfigDiff:
        """Re-read and apply; `trigger` says who asked (`api`, `sighup`, `watch`) for the log.
        InvalidConfig (400) when the re-read config is invalid: nothing changed."""
        ...
