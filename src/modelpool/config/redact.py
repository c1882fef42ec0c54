"""The effective config as a plain mapping that is safe to print or log."""

from __future__ import annotations

from typing import Any

from modelpool.config.schema import Config

REDACTED = "***"
_SECRET_WORDS = ("secret", "password", "token", "api_key", "apikey", "authorization")
# `api_key_env: NAME` names an env var; the name is not a secret and helps debugging.
_NOT_SECRET_SUFFIXES = ("_env", "_tokens", "_token_id", "_token_ids")


def redacted_config(config: Config) -> dict[str, Any]:
    return _redact_dict(config.model_dump(mode="json"))


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    if lowered.endswith(_NOT_SECRET_SUFFIXES):
        return False
    return any(word in lowered for word in _SECRET_WORDS)


def redact(value: Any) -> Any:
    """A copy of plain data with secret-looking keys masked."""
    return _redact(value)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return _redact_dict(value)
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


def _redact_dict(value: dict[str, Any]) -> dict[str, Any]:
    return {k: (REDACTED if is_secret_key(str(k)) and v is not None else _redact(v)) for k, v in value.items()}
