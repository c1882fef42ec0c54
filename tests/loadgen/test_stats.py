"""The summary maths: percentiles, rates over the level's wall time, errors by kind."""

from __future__ import annotations

import math

import pytest

from modelpool.loadgen import RequestRecord, percentile, summarize


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1.0], 50, 1.0),
        ([1.0, 2.0], 50, 1.5),
        ([3.0, 1.0, 2.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 90, 4.6),
        (list(map(float, range(1, 101))), 99, 99.01),
        ([1.0, 2.0, 3.0], 0, 1.0),
        ([1.0, 2.0, 3.0], 100, 3.0),
        ([1.0, math.nan, 3.0], 50, 2.0),
    ],
)
def test_percentile_interpolates_between_ranks(values, p, expected):
    assert percentile(values, p) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))
    assert math.isnan(percentile([math.nan], 50))


def record(index, *, latency, ttft=None, tokens=0, usage=True, gaps=(), error=None):
    made = RequestRecord(index, 4, latency_s=latency, ttft_s=ttft, output_tokens=tokens, tokens_from_usage=usage)
    made.chunk_gaps_s = list(gaps)
    if error:
        made.fail(error, "why")
    return made


def test_summary_counts_rates_and_spreads():
    records = [
        record(0, latency=1.0, ttft=0.2, tokens=9, gaps=[0.1] * 8),
        record(1, latency=2.0, ttft=0.4, tokens=17, gaps=[0.1] * 16),
        record(2, latency=5.0, error="http_401"),
        record(3, latency=0.1, error="timeout"),
        record(4, latency=0.1, error="http_401"),
    ]
    summary = summarize(records, concurrency=4, wall_s=2.0)
    assert (summary.requests, summary.succeeded) == (5, 2)
    assert summary.requests_per_s == pytest.approx(1.0)  # successes over the wall time
    assert summary.output_tokens == 26
    assert summary.output_tokens_per_s == pytest.approx(13.0)
    assert summary.errors == {"http_401": 2, "timeout": 1}
    assert summary.ttft.p50 == pytest.approx(0.3)
    assert summary.latency.p50 == pytest.approx(1.5)  # failures are not in the latency spread
    assert summary.inter_token.p50 == pytest.approx(0.1)
    assert summary.time_per_output_token.p50 == pytest.approx(0.1)  # (1.0-0.2)/8 and (2.0-0.4)/16
    assert summary.tokens_from_usage


def test_summary_says_when_tokens_were_counted_as_chunks():
    summary = summarize([record(0, latency=1, tokens=3, usage=True), record(1, latency=1, tokens=3, usage=False)], 2, 1)
    assert not summary.tokens_from_usage


def test_summary_of_only_failures_has_no_spreads():
    summary = summarize([record(0, latency=1, error="connect")], 1, 1.0)
    assert summary.succeeded == 0 and summary.requests_per_s == 0
    assert math.isnan(summary.latency.p50) and math.isnan(summary.ttft.p99)
    assert not summary.tokens_from_usage
