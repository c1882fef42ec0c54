"""Percentiles and the summary of one concurrency level (pure functions of the records)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from modelpool.loadgen.records import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile, linear between the closest ranks (numpy's default); NaN for none."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Spread:
    """p50/p90/p99 and the mean of one measure, in seconds; NaN where nothing was measured."""

    p50: float = math.nan
    p90: float = math.nan
    p99: float = math.nan
    mean: float = math.nan

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            return cls()
        p50, p90, p99 = (percentile(values, p) for p in PERCENTILES)
        return cls(p50, p90, p99, mean=sum(values) / len(values))


@dataclass(frozen=True)
class LevelSummary:
    """What one level's requests add up to. Rates are over the level's wall time (its first
    send to its last reply); latency spreads are of the successful requests only."""

    concurrency: int
    requests: int
    succeeded: int
    wall_s: float
    requests_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    prompt_tokens: int
    output_bytes: int
    tokens_from_usage: bool  # every success's tokens came from the server's usage
    ttft: Spread
    inter_token: Spread  # gaps between content chunks, pooled over the level's streams
    time_per_output_token: Spread  # per request: (latency − TTFT) / (tokens − 1)
    latency: Spread
    errors: dict[str, int] = field(default_factory=dict)
    resent: int = 0  # requests sent again on a fresh connection (see `requests._open`)


def summarize(records: list[RequestRecord], concurrency: int, wall_s: float) -> LevelSummary:
    good = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in good)
    rate = (lambda amount: amount / wall_s) if wall_s > 0 else (lambda amount: math.nan)
    tpot = [
        (r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in good if r.ttft_s is not None and r.output_tokens > 1
    ]
    return LevelSummary(
        concurrency=concurrency,
        requests=len(records),
        succeeded=len(good),
        wall_s=wall_s,
        requests_per_s=rate(len(good)),
        output_tokens=output,
        output_tokens_per_s=rate(output),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in good),
        output_bytes=sum(r.output_bytes for r in good),
        tokens_from_usage=bool(good) and all(r.tokens_from_usage for r in good),
        ttft=Spread.of([r.ttft_s for r in good if r.ttft_s is not None]),
        inter_token=Spread.of([gap for r in good for gap in r.chunk_gaps_s]),
        time_per_output_token=Spread.of(tpot),
        latency=Spread.of([r.latency_s for r in good]),
        errors=dict(sorted(Counter(r.error for r in records if r.error is not None).items())),
        resent=sum(r.resent for r in records),
    )
