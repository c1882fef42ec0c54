"""A batch's input file read and checked before anything runs: every line is an object
with a unique `custom_id`, `method` POST, `url` the batch's endpoint and a `body` the
endpoint's own schema takes (checked by the protocol layer's `LineCheck`). Every problem
is listed with its 1-based line, as OpenAI's `errors.data`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpool.errors import InvalidRequest
from modelpool.pool_api.batches import LineError

LineCheck = Callable[[str, dict[str, Any]], str]
"""(endpoint, body) → the model the body names; raises `InvalidRequest` saying what is wrong."""
MAX_ERRORS = 1000
"""Problems listed for one file at most (the rest are counted in the last entry)."""


@dataclass(frozen=True)
class BatchLine:
    index: int
    """0-based position among the file's lines (blank lines skipped), valid or not."""
    custom_id: str
    body: bytes
    """The request body as JSON, as the endpoint receives it."""


def read_lines(path: Path, endpoint: str, check: LineCheck) -> tuple[list[BatchLine], list[LineError], str | None]:
    """The file's requests, the problems found (none: it may run) and the first model named."""
    lines: list[BatchLine] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    model: str | None = None
    with open(path, "rb") as source:
        numbered = (raw for raw in source if raw.strip())
        for number, raw in enumerate(numbered, start=1):
            try:
                line, named = _one(raw, endpoint, check, seen)
            except InvalidRequest as exc:
                errors.append(LineError(exc.code, exc.message, number, exc.param))
                continue
            model = model or named
            # its place in the file, not among the valid lines: what a resume skips cannot shift
            lines.append(BatchLine(number - 1, line.custom_id, line.body))
    if len(errors) > MAX_ERRORS:
        more = len(errors) - MAX_ERRORS
        errors = [*errors[:MAX_ERRORS], LineError("too_many_errors", f"{more} more lines have problems.")]
    return lines, errors, model


def _one(raw: bytes, endpoint: str, check: LineCheck, seen: set[str]) -> tuple[BatchLine, str]:
    try:
        item = json.loads(raw)
    except ValueError:
        raise InvalidRequest("The line is not valid JSON.") from None
    if not isinstance(item, dict):
        raise InvalidRequest("The line is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        raise InvalidRequest("custom_id must be a string of 1 to 512 characters.", param="custom_id")
    if custom_id in seen:
        raise _Duplicate(f"The custom_id '{custom_id[:64]}' is used by an earlier line.", param="custom_id")
    if item.get("method") != "POST":
        raise InvalidRequest("method must be 'POST'.", param="method")
    if item.get("url") != endpoint:
        raise _Mismatch(f"url must be the batch's endpoint, '{endpoint}'.", param="url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object.", param="body")
    if body.get("stream"):
        raise InvalidRequest("A batch request cannot stream: leave out 'stream'.", param="body.stream")
    model = check(endpoint, body)
    seen.add(custom_id)
    return BatchLine(0, custom_id, json.dumps(body).encode()), model


class _Duplicate(InvalidRequest):
    code = "duplicate_custom_id"


class _Mismatch(InvalidRequest):
    code = "mismatched_url"
