"""Keys a models.yaml names (`api_key_env: NGC_API_KEY`) from outside the process
environment: a `.env` file beside the models file, and saved credentials.

Precedence, highest first (a real environment variable is never overridden):
1. the process environment;
2. `.env` beside the models file (or the stack file), else in the working directory;
3. the credentials file: `$MODELPOOL_CREDENTIALS`, else `$XDG_CONFIG_HOME/modelpool/credentials.json`
   (`~/.config/modelpool/credentials.json`), written by `modelpool credentials set NAME`;
4. the agent sample's own cache, `~/.config/xr-ai/credentials.json`, read as it is.

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
from collections.abc import Mapping
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
    if not value or len(value) > MAX_VALUE or any(c in value for c in "\r\n\0"):
        raise ConfigError(f"the value for {name} must be one line of 1 to {MAX_VALUE} characters")
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
    """`NAME=value` lines (`export NAME=value`, quotes, `#` comments); a line that is none of
    these is an error naming its number (never its text: it may hold a key)."""
    text = _read_bounded(path, ".env file")
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise ConfigError(f"{path}: line {number} is not NAME=value")
        values[match.group(1)] = _unquote(match.group(2))
    return values


def dotenv_beside(folder: Path) -> Path | None:
    """The `.env` a models or stack file in `folder` uses: its own, else the working directory's."""
    for candidate in (folder / DOTENV, Path.cwd() / DOTENV):
        if candidate.is_file():
            return candidate
    return None


def layered_environ(folder: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a models file in `folder` reads keys from (precedence above)."""
    found = dotenv_beside(folder)
    dotenv = read_dotenv(found) if found is not None else {}
    return {**saved_credentials(), **dotenv, **(os.environ if environ is None else environ)}


def _read_credentials(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    mode = stat.S_IMODE(path.stat().st_mode)
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
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")  # created 0600
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(dict(entries), file, indent=2)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value.split(" #", 1)[0].rstrip()
