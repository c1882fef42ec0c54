"""The rows of `/v1/admin/usage`: each key's usage since start, its rate limits and what
is left of them (the limiter itself is middleware, `server/ratelimit.py`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from modelpool.pool_api.usage import KeyReport, UsageRow

MAX_UNIX_TIME = 2**40
WINDOW_RULE = "start_time, end_time and group_by=model need usage_store.enabled"


def usage_json(report: KeyReport) -> dict[str, Any]:
    """One key's row of /v1/admin/usage. `remaining`: per limit, null where unlimited; null
    as a whole for anonymous use, whose budgets are per client address."""
    remaining = None
    if report.remaining is not None:
        left = {state.kind: state.remaining for state in report.remaining}
        remaining = {"requests": left.get("requests"), "tokens": left.get("tokens")}
    return {"key": report.key, **asdict(report.usage), "limits": asdict(report.limits), "remaining": remaining}


def usage_row_json(row: UsageRow) -> dict[str, Any]:
    """One row of `windowed`: a key's (and model's) use in the asked hours."""
    usage = asdict(row.usage)
    return {"key": row.account, **({"model": row.model or None} if row.model is not None else {}), **usage}
