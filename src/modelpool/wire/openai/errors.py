"""OpenAI's error envelope {"error": {message, type, param, code}}: for a ModelpoolError,
for a request that failed validation (400, never 422, with the offending `param` named the
way OpenAI's API names it: `messages[0].content`), and for a bug (a 500 naming the request
id, no traceback)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelpool.errors import ModelpoolError

# Pydantic puts union-member and validator tags into `loc`; they are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(exc: ModelpoolError) -> dict[str, Any]:
    return error_body(exc.message, exc.type, exc.code, exc.param)


def internal_error_body(request_id: str) -> dict[str, Any]:
    """What a client sees of a bug: the request id to report, never a traceback."""
    message = f"The server had an error while processing your request (request id {request_id})."
    return error_body(message, "server_error", "internal_error")


def param_from_loc(loc: Sequence[Any]) -> str | None:
    """("body", "messages", 0, "content", "str") → "messages[0].content"."""
    param = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _is_type_tag(str(part)):
            continue
        else:
            param += f".{part}" if param else str(part)
    return param or None


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    # A value that fits no member of a union yields one error per member; the deepest one
    # (["ok", "\ud800"] → input[1], not "input is not a string") says what is wrong.
    # A list over its cap says so, whatever the union's other members said about it.
    too_long = [e for e in errors if e.get("type") == "too_long"]
    first = too_long[0] if too_long else max(errors, key=lambda e: len(e.get("loc", ())))
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}", None
    param = param_from_loc(first.get("loc", ()))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'." if param else "The request body is missing."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return message, param


def _is_type_tag(part: str) -> bool:
    # A model class of a union (`DocumentObject`) names the member, not a field: wire fields are lower case.
    return (
        part in _TYPE_TAGS
        or "[" in part
        or part[:1].isupper()
        or part.startswith(("function-", "tagged-union", "json-or-python"))
    )
