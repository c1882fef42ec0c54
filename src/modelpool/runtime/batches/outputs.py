"""A batch's output lines in OpenAI's format, and the two files they end in: successes in
the output file, the rest (a 4xx or 5xx the endpoint answered) in the error file, each in
the input's order, as `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}`."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from modelpool.pool_api.batches import BatchRecord, FileRecord, LineAnswer
from modelpool.runtime.batches import records
from modelpool.runtime.batches.files import FileStore, new_id
from modelpool.runtime.batches.lines import BatchLine


def line_output(request_id: str, custom_id: str, answer: LineAnswer) -> tuple[str, tuple[int, int]]:
    """The output line of one request, and the (input, output) tokens it used."""
    response = {"status_code": answer.status_code, "request_id": answer.request_id, "body": answer.body}
    line = {"id": request_id, "custom_id": custom_id, "response": response, "error": None}
    return json.dumps(line, separators=(",", ":")), _tokens(answer.body)


def expired_row(line: BatchLine) -> records.ResultRow:
    """The error-file row of a line the 24 h window ended before it ran."""
    error = {"code": "batch_expired",
             "message": "This request could not be executed before the completion window expired."}  # fmt: skip
    output = {"id": new_id("batch_req"), "custom_id": line.custom_id, "response": None, "error": error}
    return (line.index, False, json.dumps(output, separators=(",", ":")), 0, 0)


def _tokens(body: Any) -> tuple[int, int]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    output = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return int(prompt or 0), int(output or 0)


def write_outputs(files: FileStore, batch: BatchRecord, rows: list[records.ResultRow]) -> list[FileRecord]:
    """The output file (if any line succeeded) and the error file (if any failed), written
    and synced (run on a worker thread). Their records are for the caller to keep."""
    made = []
    for ok, suffix in ((True, "output"), (False, "error")):
        chosen = [row[2] for row in rows if row[1] is ok]
        if not chosen:
            continue
        file_id = new_id("file")
        path = files.path_of(file_id)
        data = ("\n".join(chosen) + "\n").encode()
        with open(path, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        made.append(FileRecord(file_id, batch.owner, f"{batch.id}_{suffix}.jsonl", "batch_output", len(data),
                               int(time.time()), len(chosen)))  # fmt: skip
    return made
