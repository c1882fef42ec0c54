"""The effective config as a plain mapping that is safe to print or log."""

from __future__ import annotations

from typing import Any

from modelpool.config.schema import Config

REDACTED = "***"
_SECRET_WORDS = ("secret", "password", "passwd", "pass", "token", "api_key", "apikey", "authorization",
                 "credential", "private")  # fmt: skip
# `api_key_env: NAME` names an env var; the name is not a secret and helps debugging.
_NOT_SECRET_SUFFIXES = ("_env", "_tokens", "_token_id", "_token_ids")
_ARGUMENT_LISTS = ("extra_args", "args")
"""Command lines: the value of a flag with a secret-looking name is masked (`--api-key X`,
`--hf-token=X`)."""


def redacted_config(config: Config) -> dict[str, Any]:
    return _redact_dict(config.model_dump(mode="json"))


def is_secret_key(key: str) -> bool:
    lowered = key.lower().lstrip("-").replace("-", "_")
    if lowered.endswith(_NOT_SECRET_SUFFIXES):
        return False
    return lowered.endswith("key") or any(word in lowered for word in _SECRET_WORDS)


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
    return {str(k): _redact_entry(str(k), v) for k, v in value.items()}


def _redact_entry(key: str, value: Any) -> Any:
    if value is None:
        return None
    if is_secret_key(key) and not isinstance(value, (bool, int, float)):  # a limit or a switch is no secret
        return REDACTED
    if key in _ARGUMENT_LISTS and isinstance(value, list):
        return _redacted_arguments(value)
    return _redact(value)


def _redacted_arguments(arguments: list[Any]) -> list[Any]:
    shown: list[Any] = []
    masking_next = False
    for argument in arguments:
        if masking_next:
            shown.append(REDACTED)
            masking_next = False
            continue
        if isinstance(argument, str) and argument.startswith("-"):
            flag, equals, _ = argument.partition("=")
            if is_secret_key(flag):
                if equals:
                    shown.append(f"{flag}={REDACTED}")
                    continue
                masking_next = True
        shown.append(argument)
    return shown
