"""A repo's files at a revision: from the hub (one API call), or from the cache when offline.

Errors become ModelSourceError messages that name the repo, the endpoint and what to do
(HF_TOKEN for a gated repo, HF_HUB_OFFLINE and the cache when there is no network)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.reference import HubReference

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    revision: str
    """As asked (a branch, a tag or a sha)."""
    commit: str
    sizes: Mapping[str, int]
    """Every file at that commit and its size in bytes."""
    from_cache: bool = False

    def names(self) -> list[str]:
        return sorted(self.sizes)


def repo_folder(access: HubAccess, repo_id: str) -> Path:
    """Where huggingface_hub caches a model repo: `models--org--name`."""
    return access.cache_root / ("models--" + repo_id.replace("/", "--"))


def snapshot_folder(access: HubAccess, listing: RepoListing) -> Path:
    return repo_folder(access, listing.repo_id) / "snapshots" / listing.commit


def list_repo(ref: HubReference, access: HubAccess) -> RepoListing:
    """The files at `ref`'s revision: online unless offline; offline, from the cache."""
    if access.offline:
        cached = cached_listing(ref, access)
        if cached is None:
            raise ModelSourceError(offline_message(ref, access))
        return cached
    import huggingface_hub

    api = huggingface_hub.HfApi(endpoint=access.endpoint, token=access.client_token())
    try:
        info = api.model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
    except Exception as exc:
        cached = cached_listing(ref, access) if _is_network(exc) else None
        if cached is not None:  # no network: what the cache has, as huggingface_hub itself does
            return cached
        raise hub_error(ref, access, exc) from None
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    return RepoListing(ref.repo_id, ref.revision or "main", str(info.sha), sizes)


def cached_listing(ref: HubReference, access: HubAccess) -> RepoListing | None:
    """The files of the cached snapshot for `ref`'s revision (only what was downloaded)."""
    folder = repo_folder(access, ref.repo_id)
    revision = ref.revision or "main"
    commit = revision if _COMMIT.fullmatch(revision) else None
    ref_file = folder / "refs" / revision
    if commit is None and ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = folder / "snapshots" / (commit or "")
    if commit is None or not snapshot.is_dir():
        return None
    files = [p for p in snapshot.rglob("*") if p.is_file()]
    sizes = {p.relative_to(snapshot).as_posix(): p.stat().st_size for p in files}
    return RepoListing(ref.repo_id, revision, commit, sizes, from_cache=True)


def record_ref(access: HubAccess, listing: RepoListing) -> None:
    """Note in the cache which commit a branch or tag named (`refs/<name>`, as huggingface_hub
    does), so an offline resolution finds the snapshot by the name it was pulled by."""
    if listing.from_cache or _COMMIT.fullmatch(listing.revision):
        return
    ref_file = repo_folder(access, listing.repo_id) / "refs" / listing.revision
    if ref_file.is_file() and ref_file.read_text().strip() == listing.commit:
        return
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    partial = ref_file.with_name(f".{ref_file.name}.{os.getpid()}.tmp")
    partial.write_text(listing.commit)
    os.replace(partial, ref_file)  # readers never see a half-written ref


def offline_message(ref: HubReference, access: HubAccess) -> str:
    return (
        f"{ref} is not in the Hugging Face cache ({access.cache_root}) and downloads are off "
        "(HF_HUB_OFFLINE is set or the config says `offline: true`). Pull it where there is a network "
        f"(`modelpool pull {ref}`) and copy the cache, or point `source` at a local path."
    )


def hub_error(ref: HubReference, access: HubAccess, exc: BaseException) -> ModelSourceError:
    """A huggingface_hub/httpx error as a message a user can act on (no token in it)."""
    from huggingface_hub import errors

    where = f"{ref} at {access.endpoint}"
    if isinstance(exc, errors.GatedRepoError):
        status = exc.response.status_code if exc.response is not None else 401
        fix = "HF_TOKEN has no access to it: accept its terms on the repo page" if status == 403 else "set HF_TOKEN"
        message = f"{where} is gated: {fix} (a token from https://huggingface.co/settings/tokens)"
    elif isinstance(exc, errors.RevisionNotFoundError):
        message = f"{where}: the repo has no revision '{ref.revision}'"
    elif isinstance(exc, errors.RepositoryNotFoundError):
        message = f"{where}: no such repo (or it is private: set HF_TOKEN)"
    elif isinstance(exc, errors.RemoteEntryNotFoundError):
        message = f"{where}: a file is missing at that revision ({exc.__class__.__name__})"
    elif _is_network(exc):
        message = (
            f"cannot reach {access.endpoint} for {ref} ({type(exc).__name__}). Check the network or HF_ENDPOINT; "
            "with HF_HUB_OFFLINE=1 only the cache is used"
        )
    else:
        message = f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return ModelSourceError(access.scrub(message))


def _is_network(exc: BaseException) -> bool:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    return isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError, OfflineModeIsEnabled))


def sizes_of(listing: RepoListing, names: Sequence[str]) -> int:
    return sum(listing.sizes.get(name, 0) for name in names)
