"""A batch's input file read and checked before anything runs: every line is an object
with a unique `custom_id`, `method` POST, `url` the batch's endpoint and a `body` the
endpoint's own schema takes (checked by the protocol layer's `LineCheck`). Every problem
is listed with its 1-based line, as OpenAI's `errors.data`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpool.errors import InvalidRequest
from modelpool.pool_api.batches import LineError

LineCheck = Callable[[str, dict[str, Any]], str]
"""(endpoint, body) → the model the body names; raises `InvalidRequest` saying what is wrong."""
MAX_ERRORS = 100
"""Problems listed for one file at most (the rest are counted in the last entry): a failed
batch is kept with them, `batch_api.key_batches_kept` of them per key."""


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
    model: str | None = None
    for line, named, error in _parsed(path, endpoint, check, set()):
        if error is not None:
            errors.append(error)
            continue
        assert line is not None
        model = model or named
        lines.append(line)
    return lines, _capped(errors), model


def check_lines(path: Path, endpoint: str, check: LineCheck) -> tuple[int, list[LineError], str | None]:
    """As `read_lines`, keeping only the count of the requests (not their bodies)."""
    count, model = 0, None
    errors: list[LineError] = []
    for _, named, error in _parsed(path, endpoint, check, set()):
        if error is not None:
            errors.append(error)
        else:
            count, model = count + 1, model or named
    return count, _capped(errors), model


def stream_lines(path: Path, endpoint: str, check: LineCheck) -> Iterator[BatchLine]:
    """The valid requests one by one, read as they are asked for: a batch waiting for its
    turn holds none of them (its file was checked whole when it was made)."""
    for line, _, error in _parsed(path, endpoint, check, None):
        if error is None and line is not None:
            yield line


def _parsed(
    path: Path, endpoint: str, check: LineCheck, seen: set[str] | None
) -> Iterator[tuple[BatchLine | None, str, LineError | None]]:
    """Each non-blank line: (the request, its model, None) or (None, "", what is wrong).
    `seen`: the custom_ids so far, to refuse a duplicate (None: not checked again)."""
    with open(path, "rb") as source:
        numbered = (raw for raw in source if raw.strip())
        for number, raw in enumerate(numbered, start=1):
            try:
                line, named = _one(raw, endpoint, check, set() if seen is None else seen)
            except InvalidRequest as exc:
                yield None, "", LineError(exc.code, exc.message, number, exc.param)
                continue
            # its place in the file, not among the valid lines: what a resume skips cannot shift
            yield BatchLine(number - 1, line.custom_id, line.body), named, None


def _capped(errors: list[LineError]) -> list[LineError]:
    if len(errors) <= MAX_ERRORS:
        return errors
    more = len(errors) - MAX_ERRORS
    return [*errors[:MAX_ERRORS], LineError("too_many_errors", f"{more} more lines have problems.")]


def _one(raw: bytes, endpoint: str, check: LineCheck, seen: set[str]) -> tuple[BatchLine, str]:
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
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
