"""The summary table (one row per concurrency level) and the `--json` file."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from modelpool.loadgen.records import RequestRecord
from modelpool.loadgen.runner import LevelRun
from modelpool.loadgen.spec import LoadPlan, LoadSpec
from modelpool.loadgen.stats import LevelSummary, Spread

GENERATES = ("chat", "completion")


def _ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1000:,.0f}" if seconds >= 0.1 else f"{seconds * 1000:.1f}"


def _spread(spread: Spread) -> str:
    return " / ".join(_ms(v) for v in (spread.p50, spread.p90, spread.p99))


def _errors(summary: LevelSummary) -> str:
    return ", ".join(f"{kind} ×{count}" for kind, count in summary.errors.items()) or "0"


def table(spec: LoadSpec, runs: list[LevelRun]) -> Table:
    """One row per level. Token counts marked ≈ were counted as chunks (no usage sent)."""
    first_label = "TTFB" if spec.kind == "speech" else "TTFT"
    out = Table(title=f"{spec.kind} · {spec.model} · {spec.url()}", title_justify="left")
    out.add_column("concurrency", justify="right")
    out.add_column("requests", justify="right")
    out.add_column("req/s", justify="right")
    if spec.kind in GENERATES:
        out.add_column("out tok/s", justify="right")
    if spec.kind in GENERATES or spec.kind == "speech":
        out.add_column(f"{first_label} p50/p90/p99 ms", justify="right")
    if spec.kind in GENERATES and spec.stream:
        out.add_column("ITL p50/p90/p99 ms", justify="right")
    out.add_column("latency p50/p90/p99 ms", justify="right")
    out.add_column("errors")
    for run in runs:
        s = run.summary
        row = [str(s.concurrency), f"{s.succeeded}/{s.requests}", f"{s.requests_per_s:.2f}"]
        if spec.kind in GENERATES:
            row.append(f"{s.output_tokens_per_s:.1f}{'' if s.tokens_from_usage or not s.succeeded else ' ≈'}")
        if spec.kind in GENERATES or spec.kind == "speech":
            row.append(_spread(s.ttft))
        if spec.kind in GENERATES and spec.stream:
            row.append(_spread(s.inter_token))
        row += [_spread(s.latency), _errors(s)]
        out.add_row(*row)
    return out


def notes(spec: LoadSpec, runs: list[LevelRun]) -> list[str]:
    """What the table's reader must know: how tokens were counted, what was sent twice."""
    said = []
    counted = [r.summary.concurrency for r in runs if r.summary.succeeded and not r.summary.tokens_from_usage]
    if spec.kind in GENERATES and counted:
        how = "content chunks counted" if spec.stream else "no tokens counted"
        said.append(f"≈ the server sent no usage at concurrency {counted}: {how} as output tokens")
    if resent := sum(r.summary.resent for r in runs):
        said.append(
            f"{resent} request(s) sent again on a fresh connection: the server closed a kept-alive one "
            "before answering (their latency includes the failed try)"
        )
    return said


def spec_facts(spec: LoadSpec) -> dict[str, Any]:
    """The spec as the JSON file states it: no key, no audio bytes, the prompts counted."""
    return {
        "url": spec.url(),
        "model": spec.model,
        "kind": spec.kind,
        "prompts": len(spec.prompts),
        "max_tokens": spec.max_tokens,
        "stream": spec.stream,
        "ignore_eos": spec.ignore_eos,
        "temperature": spec.temperature,
        "timeout_s": spec.timeout_s,
        "api_key": "set" if spec.api_key else None,
        "audio_bytes": len(spec.audio) or None,
    }


def write_json(
    path: Path, spec: LoadSpec, plan: LoadPlan, warmup: list[RequestRecord], runs: list[LevelRun], **meta: Any
) -> None:
    payload = {
        **meta,
        "spec": spec_facts(spec),
        "plan": asdict(plan),
        "warmup": [asdict(r) for r in warmup],
        "levels": [{"summary": asdict(run.summary), "records": [asdict(r) for r in run.records]} for run in runs],
    }
    path.write_text(json.dumps(_finite(payload), indent=1, allow_nan=False) + "\n", encoding="utf-8")


def _finite(value: Any) -> Any:
    """NaN (nothing measured) as null: strict JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
