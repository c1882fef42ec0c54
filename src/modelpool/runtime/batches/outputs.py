"""A batch's output lines in OpenAI's format, and the two files they end in: successes in
the output file, the rest (a 4xx or 5xx the endpoint answered) in the error file, each in
the input's order, as `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}`."""

from __future__ import annotations

import heapq
import json
import os
import sqlite3
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


def write_outputs(
    files: FileStore, db: sqlite3.Connection, batch: BatchRecord, expired: list[records.ResultRow]
) -> list[FileRecord]:
    """The output file (if any line succeeded) and the error file (if any failed), written
    and synced (run on a worker thread, holding the database). The finished lines stream
    from SQLite in the input's order, merged with `expired` (lines the window closed on),
    so a large output is never held in memory. Their records are for the caller to keep."""
    stored = records.result_outputs(db, batch.id)
    merged = heapq.merge(stored, ((row[0], row[1], row[2]) for row in expired))
    sinks: dict[bool, _Sink] = {}
    try:
        for _, ok, output in merged:
            if ok not in sinks:
                sinks[ok] = _Sink(files, batch, "output" if ok else "error")
            sinks[ok].write(output)
        return [sinks[ok].close() for ok in (True, False) if ok in sinks]
    except BaseException:
        for sink in sinks.values():
            sink.discard()
        raise


class _Sink:
    """One output file being written: its lines, then synced and described."""

    def __init__(self, files: FileStore, batch: BatchRecord, suffix: str) -> None:
        self.id = new_id("file")
        self.path = files.path_of(self.id)
        self.name = f"{batch.id}_{suffix}.jsonl"
        self.owner = batch.owner
        self.lines = self.bytes = 0
        self._out = open(self.path, "wb")  # noqa: SIM115 - closed by close() or discard()

    def write(self, line: str) -> None:
        data = line.encode() + b"\n"
        self._out.write(data)
        self.lines += 1
        self.bytes += len(data)

    def close(self) -> FileRecord:
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        return FileRecord(self.id, self.owner, self.name, "batch_output", self.bytes, int(time.time()), self.lines)

    def discard(self) -> None:
        self._out.close()
        self.path.unlink(missing_ok=True)
