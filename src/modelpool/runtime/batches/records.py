"""Batch records in SQLite: the whole record as JSON beside its id, owner and status, and
one row per finished line (its output line and tokens), so a restart knows what is done."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from modelpool.pool_api.batches import BatchRecord, LineError, RequestCounts

ResultRow = tuple[int, bool, str, int, int]
"""(line, ok, output line, input tokens, output tokens)."""
ResultCount = tuple[int, bool, int, int, int]
"""(line, ok, input tokens, output tokens, bytes of the output line): a finished line
without its output, which may be large."""


def save_batch(db: sqlite3.Connection, record: BatchRecord) -> None:
    db.execute(
        "INSERT OR REPLACE INTO batches VALUES (?,?,?,?,?)",
        (record.id, record.owner, record.created_at, record.status, json.dumps(asdict(record))),
    )


def load_batches(db: sqlite3.Connection) -> list[BatchRecord]:
    rows = db.execute("SELECT record FROM batches ORDER BY created_at, rowid").fetchall()
    return [batch_of(json.loads(row[0])) for row in rows]


def batch_of(data: dict[str, Any]) -> BatchRecord:
    errors = [LineError(**error) for error in data.pop("errors")]
    counts = RequestCounts(**data.pop("counts"))
    return BatchRecord(**data, errors=errors, counts=counts)


def save_result(
    db: sqlite3.Connection, batch_id: str, line: int, ok: bool, output: str, tokens: tuple[int, int]
) -> None:
    row = (batch_id, line, int(ok), output, *tokens)
    db.execute("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?)", row)


def result_counts(db: sqlite3.Connection, batch_id: str) -> list[ResultCount]:
    """The finished lines, in the input's order, without their outputs."""
    rows = db.execute(
        "SELECT line, ok, tokens_in, tokens_out, LENGTH(CAST(output AS BLOB)) FROM results WHERE batch_id = ? "
        "ORDER BY line",
        (batch_id,),
    )
    return [(line, bool(ok), tokens_in, tokens_out, size) for line, ok, tokens_in, tokens_out, size in rows]


def result_outputs(db: sqlite3.Connection, batch_id: str) -> Iterator[tuple[int, bool, str]]:
    """(line, ok, output line) of each finished line, in the input's order, read as iterated."""
    rows = db.execute("SELECT line, ok, output FROM results WHERE batch_id = ? ORDER BY line", (batch_id,))
    return ((line, bool(ok), output) for line, ok, output in rows)


def drop_results(db: sqlite3.Connection, batch_id: str) -> None:
    """Once the output files hold them."""
    db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
