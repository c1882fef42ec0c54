"""A hub repo seen as files, for detection (the `FileView` Protocol of `modelpool.detect`,
met structurally: hub does not import detect).

`names()` is the listing at the revision; `read_text` fetches a small file through
`hf_hub_download` (into the cache, where the pull finds it later); `read_head` reads a
file's first bytes with one ranged GET (a GGUF header, without the gigabytes behind it).
Files already in the cache are read from disk."""

from __future__ import annotations

from pathlib import Path

from modelpool.hub.access import HubAccess
from modelpool.hub.listing import RepoListing, hub_error, list_repo, snapshot_folder
from modelpool.hub.reference import HubReference

MAX_TEXT_BYTES = 4 * 1024 * 1024
MAX_HEAD_BYTES = 16 * 1024 * 1024


class HubView:
    def __init__(self, ref: HubReference, access: HubAccess, listing: RepoListing | None = None) -> None:
        self.ref = ref
        self.access = access
        self.listing = listing or list_repo(ref, access)

    @property
    def label(self) -> str:
        return str(self.ref)

    def names(self) -> list[str]:
        return self.listing.names()

    def size(self, name: str) -> int | None:
        return self.listing.sizes.get(name)

    def read_text(self, name: str, limit: int) -> str | None:
        """The file as text, or None when it is absent, larger than `limit` or not UTF-8."""
        size = self.listing.sizes.get(name)
        if size is None or size > min(limit, MAX_TEXT_BYTES):
            return None
        local = snapshot_folder(self.access, self.listing) / name
        if not local.is_file():
            local = self._download(name)
        try:
            return local.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def read_head(self, name: str, size: int) -> bytes | None:
        """The first `size` bytes of the file (fewer when it is shorter), None when absent."""
        if name not in self.listing.sizes or size <= 0:
            return None
        size = min(size, MAX_HEAD_BYTES)
        local = snapshot_folder(self.access, self.listing) / name
        if local.is_file():
            with local.open("rb") as handle:
                return handle.read(size)
        if self.access.offline:
            return None
        return self._ranged_get(name, size)

    def _download(self, name: str) -> Path:
        import huggingface_hub

        try:
            path = huggingface_hub.hf_hub_download(
                self.ref.repo_id, name, revision=self.listing.commit, cache_dir=self.access.cache_root,
                endpoint=self.access.endpoint, token=self.access.client_token(),
                local_files_only=self.access.offline,
            )  # fmt: skip
        except Exception as exc:
            raise hub_error(self.ref, self.access, exc) from None
        return Path(path)

    def _ranged_get(self, name: str, size: int) -> bytes:
        from huggingface_hub import get_session, hf_hub_url

        url = hf_hub_url(self.ref.repo_id, name, revision=self.listing.commit, endpoint=self.access.endpoint)
        headers = {"Range": f"bytes=0-{size - 1}"}
        if self.access.token:
            headers["Authorization"] = f"Bearer {self.access.token}"
        try:
            response = get_session().get(url, headers=headers, follow_redirects=True, timeout=30)
            response.raise_for_status()
        except Exception as exc:
            raise hub_error(self.ref, self.access, exc) from None
        return bytes(response.content[:size])
