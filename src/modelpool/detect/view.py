"""What detection may look at: the names of a model's files, small text files, and the
first bytes of a file. `LocalView` gives them for a file or folder on disk; the hub's
`HubView` gives the same for a repo at a revision (it implements the Protocol without
importing this package)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from modelpool.errors import ModelSourceError

MAX_FILES = 20_000
"""Files a local folder may hold for detection to list it (a model has dozens)."""
MAX_DEPTH = 4
"""Folder levels below the model folder that are listed (sentence-transformers keeps its
pooling config one level down; nothing a model needs is deeper)."""

COMPANIONS = ("mmproj*.gguf", "*.onnx.json", "voices*.npz", "voices*.bin", "*-of-*.gguf")
"""Files beside a single model file that belong to it: a vision projector, a Piper voice's
config, Kokoro's voices, the other parts of a split GGUF."""


class FileView(Protocol):
    """A model's files, as far as detection may look at them (never the weights themselves)."""

    def names(self) -> Sequence[str]:
        """Every file, as a relative POSIX path."""
        ...

    def read_text(self, name: str, limit: int) -> str | None:
        """A small text file (JSON configs); None when it is missing or longer than `limit` bytes."""
        ...

    def read_head(self, name: str, size: int) -> bytes | None:
        """At most the first `size` bytes of a file (shorter when the file is); None when missing."""
        ...


class LocalView:
    """A model on disk: a folder (every file under it), or one file with its companions."""

    def __init__(self, path: Path) -> None:
        self.path = path.expanduser()
        if self.path.is_file():
            self.root = self.path.parent
            self.selected: str | None = self.path.name
            self._names = [self.path.name, *_companions(self.path)]
        elif self.path.is_dir():
            self.root, self.selected = self.path, None
            self._names = _listing(self.path)
        else:
            raise ModelSourceError(f"{path} does not exist")
        self._listed = frozenset(self._names)

    def names(self) -> Sequence[str]:
        return self._names

    def read_text(self, name: str, limit: int) -> str | None:
        path = self._file(name)
        if path is None or path.stat().st_size > limit:
            return None
        try:
            return path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def read_head(self, name: str, size: int) -> bytes | None:
        path = self._file(name)
        if path is None:
            return None
        with path.open("rb") as reader:
            return reader.read(size)

    def local_path(self, name: str) -> Path:
        """Where a listed file is on disk."""
        return self.root / name

    def _file(self, name: str) -> Path | None:
        # Only listed names: a name from a config or a header never reaches outside the view.
        return self.root / name if name in self._listed and (self.root / name).is_file() else None


def _companions(file: Path) -> list[str]:
    siblings = sorted(p.name for p in file.parent.iterdir() if p.is_file() and p.name != file.name)
    return [name for name in siblings if any(fnmatch.fnmatch(name.lower(), pattern) for pattern in COMPANIONS)]


def _listing(folder: Path) -> list[str]:
    names: list[str] = []
    for here, dirs, files in os.walk(folder):
        relative = PurePosixPath(Path(here).relative_to(folder).as_posix())
        depth = 0 if str(relative) == "." else len(relative.parts)
        # Hidden folders (.git, .cache) hold no model files; deep ones nothing detection needs.
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < MAX_DEPTH)
        names += [str(relative / f) if depth else f for f in sorted(files)]
        if len(names) > MAX_FILES:
            raise ModelSourceError(f"{folder} holds more than {MAX_FILES} files: not a model folder")
    return names
