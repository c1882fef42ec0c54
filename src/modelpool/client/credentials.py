"""Keys a models.yaml names (`api_key_env: NGC_API_KEY`) from outside the process
environment: a `.env` file beside the models file, and saved credentials.

Precedence, highest first (a real environment variable is never overridden):
1. the process environment;
2. `.env` beside the models file (or the stack file), else in the working directory;
3. the credentials file: `$MODELPOOL_CREDENTIALS`, else `$XDG_CONFIG_HOME/modelpool/credentials.json`
   (`~/.config/modelpool/credentials.json`), written by `modelpool credentials set NAME`;
4. the agent sample's own cache, `~/.config/xr-ai/credentials.json`, read as it is.

Lazily: the `.env` and the credentials files are read only when a name is not in the
process environment, so a models.yaml that needs no key (or finds it exported) never
depends on them. A `.env` line that is not `NAME=value` is skipped with a warning naming
the file and the line number (as python-dotenv does), never guessed at and never shown.

A credentials file is a JSON object of name → value that only its owner may read (mode
0600): modelpool's own is refused when others can read it, with the chmod that fixes it;
the sample's cache (which its launcher writes with the default umask) is then skipped with
a warning that says the same. Values are never printed: errors name the variable and the
file, not what it holds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from modelpool.client.errors import ConfigError

log = logging.getLogger(__name__)

CREDENTIALS_ENV = "MODELPOOL_CREDENTIALS"
DOTENV = ".env"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_VALUE = 8192
MAX_FILE = 1 << 20
"""A .env or credentials file larger than this is refused rather than read (1 MiB)."""
_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*")


def credentials_file() -> Path:
    """Where `modelpool credentials set` writes and the SDK reads saved keys."""
    explicit = os.environ.get(CREDENTIALS_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "modelpool" / "credentials.json"


def sample_credentials_file() -> Path:
    """The agent sample's cache (its launcher's `load_credentials()` reads the same file)."""
    return Path.home() / ".config" / "xr-ai" / "credentials.json"


def saved_credentials(path: Path | None = None) -> dict[str, str]:
    """The saved keys: the sample's cache under modelpool's own file (absent files: none)."""
    if path is not None:
        return _read_credentials(path)
    try:
        sample = _read_credentials(sample_credentials_file())
    except ConfigError as exc:
        log.warning("skipping the agent sample's credentials: %s", exc.message)
        sample = {}
    return {**sample, **_read_credentials(credentials_file())}


def save_credential(name: str, value: str, path: Path | None = None) -> Path:
    """Add or replace one key in the credentials file, written 0600 in a 0700 folder and
    swapped in whole (a crash never leaves half a file). Returns the file's path."""
    check_name(name)
    if not value or len(value) > MAX_VALUE or not value.isprintable():  # control characters, undecodable bytes
        raise ConfigError(f"the value for {name} must be one line of 1 to {MAX_VALUE} printable characters")
    target = path or credentials_file()
    entries = _read_credentials(target)
    entries[name] = value
    _write_private(target, entries)
    return target


def remove_credential(name: str, path: Path | None = None) -> bool:
    """Drop one key; False when it was not saved."""
    check_name(name)
    target = path or credentials_file()
    entries = _read_credentials(target)
    if entries.pop(name, None) is None:
        return False
    _write_private(target, entries)
    return True


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ConfigError(f"{name[:40]!r} is not an environment variable name (letters, digits and '_')")


def read_dotenv(path: Path) -> dict[str, str]:
    """`NAME=value` lines (`export NAME=value`, quotes, `#` comments). A line that is none
    of these is skipped with a warning naming its number (never its text: it may hold a key)."""
    text = _read_bounded(path, ".env file")
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            log.warning("%s: line %d is not NAME=value; skipped", path, number)
            continue
        values[match.group(1)] = _unquote(match.group(2))
    return values


def dotenv_beside(folder: Path) -> Path | None:
    """The `.env` a models or stack file in `folder` uses: its own, else the working directory's."""
    for candidate in (folder / DOTENV, _cwd() / DOTENV):
        try:
            if candidate.is_file():
                return candidate
        except OSError as exc:  # a folder this user may not search
            raise ConfigError(f"cannot look for {candidate}: {exc.strerror or type(exc).__name__}") from None
    return None


class KeyEnvironment(Mapping[str, str]):
    """The environment a models or stack file in `folder` reads keys from (precedence in
    the module docstring). The `.env` and the saved credentials are read on the first
    name the environment lacks, once; their problems surface then, naming the file."""

    def __init__(self, folder: Path, environ: Mapping[str, str] | None = None) -> None:
        self._folder = folder
        self._environ = os.environ if environ is None else environ
        self._dotenv: dict[str, str] | None = None
        self._saved: dict[str, str] | None = None

    def __getitem__(self, name: str) -> str:
        if name in self._environ:
            return self._environ[name]
        dotenv = self.dotenv()
        if name in dotenv:
            return dotenv[name]
        return self.saved()[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.saved(), **self.dotenv(), **self._environ})

    def __len__(self) -> int:
        return len({**self.saved(), **self.dotenv(), **self._environ})

    def dotenv(self) -> dict[str, str]:
        """The variables of the `.env` beside the file (none when there is none)."""
        if self._dotenv is None:
            found = dotenv_beside(self._folder)
            self._dotenv = read_dotenv(found) if found is not None else {}
        return self._dotenv

    def saved(self) -> dict[str, str]:
        if self._saved is None:
            self._saved = saved_credentials()
        return self._saved


def layered_environ(folder: Path, environ: Mapping[str, str] | None = None) -> KeyEnvironment:
    """The environment a models file in `folder` reads keys from (lazy: KeyEnvironment)."""
    return KeyEnvironment(folder, environ)


def _read_credentials(path: Path) -> dict[str, str]:
    try:
        if not path.exists():
            return {}
        info = path.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read credentials file {path}: {exc.strerror or type(exc).__name__}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"credentials file {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"credentials file {path} can be read by other users (mode {mode:04o}): run `chmod 600 {path}`"
        )
    try:
        data = json.loads(_read_bounded(path, "credentials file"))
    except json.JSONDecodeError:
        raise ConfigError(f"credentials file {path} is not a JSON object of name → value") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) and NAME.fullmatch(k) for k, v in data.items()):
        raise ConfigError(f"credentials file {path} is not a JSON object of name → value")
    return dict(data)


def _cwd() -> Path:
    try:
        return Path.cwd()
    except OSError:  # the working directory was removed: it has no .env then
        return Path("/nonexistent")


def _read_bounded(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_FILE:
            raise ConfigError(f"{what} {path} is larger than {MAX_FILE} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or type(exc).__name__}"
        ) from None


def _write_private(path: Path, entries: Mapping[str, str]) -> None:
    """Swap in a new file, created 0600 by mkstemp, in a folder created 0700 (every folder
    this creates: a new `~/.config` is private too)."""
    try:
        _private_folder(path.parent)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    except OSError as exc:
        raise ConfigError(f"cannot write credentials file {path}: {exc.strerror or type(exc).__name__}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(dict(entries), file, indent=2)
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise ConfigError(f"cannot write credentials file {path}: {exc.strerror or type(exc).__name__}") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _private_folder(folder: Path) -> None:
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for created in reversed(missing):
        created.mkdir(mode=0o700, exist_ok=True)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value.split(" #", 1)[0].rstrip()
