"""How to reach the hub, read from the environment when a pull starts (not at import, as
huggingface_hub's own constants are): the endpoint (HF_ENDPOINT), the token (HF_TOKEN) and
whether to stay offline (HF_HUB_OFFLINE, or the config's `offline`). The token is kept out
of every repr and message."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HubAccess:
    cache_dir: Path | None = None
    """The Hugging Face cache (None: huggingface_hub's own, HF_HUB_CACHE or ~/.cache/huggingface/hub)."""
    offline: bool = False
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = field(default=None, repr=False)

    @staticmethod
    def from_env(
        cache_dir: Path | None = None, *, offline: bool = False, environ: Mapping[str, str] | None = None
    ) -> HubAccess:
        env = os.environ if environ is None else environ
        cache = cache_dir or (Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else None)
        env_offline = (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").lower() in _TRUE
        endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None
        return HubAccess(cache, offline or env_offline, endpoint, token)

    @property
    def cache_root(self) -> Path:
        """The cache folder itself (resolving huggingface_hub's default)."""
        if self.cache_dir is not None:
            return self.cache_dir.expanduser()
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE).expanduser()

    def client_token(self) -> str | bool | None:
        """What to hand huggingface_hub: our token, else None (its stored login, if any)."""
        return self.token

    def scrub(self, text: str) -> str:
        """`text` with the token blanked out (an error message from below may echo a header)."""
        return text.replace(self.token, "***") if self.token else text
