"""The metrics history behind the workbench's charts: per-interval rates from cumulative
counters, p50/p99 from histogram bucket deltas (linear inside a bucket), a bounded ring."""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelpool.runtime.metrics.history import Gauges, MetricsHistory, quantile, read_gauges
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.status import MemoryStatus, ModelStatus
from tests.fakes import FakeBackend, ManualClock, fake_slot

INF = float("inf")
CHAT = "/v1/chat/completions"


def test_quantiles_interpolate_inside_the_bucket_that_holds_the_rank() -> None:
    buckets = ((0.1, 2.0), (0.5, 6.0), (1.0, 10.0), (INF, 10.0))
    assert quantile(buckets, 0.5) == pytest.approx(0.4)  # rank 5: 3 of the 4 in (0.1, 0.5]
    assert quantile(buckets, 0.99) == pytest.approx(0.9875)  # rank 9.9: 3.9 of the 4 in (0.5, 1]
    assert quantile(buckets, 0.1) == pytest.approx(0.05)  # the first bucket starts at 0
    assert quantile(((0.1, 1.0), (INF, 4.0)), 0.5) == 0.1  # past the last finite bound: that bound
    assert quantile(((0.1, 0.0), (INF, 0.0)), 0.5) is None
    assert quantile((), 0.5) is None


def test_a_point_holds_the_rates_and_latencies_of_its_interval_only() -> None:
    metrics, clock = Metrics(), ManualClock()
    history = MetricsHistory(metrics.registry, lambda: [], clock)
    metrics.observe_request("m", CHAT, 200, 0.004)  # before the baseline: not in the first point
    assert history.sample() is None
    for seconds in (0.02, 0.03, 0.2):
        metrics.observe_request("m", CHAT, 200, seconds)
    metrics.observe_request("m", CHAT, 500, 0.7)
    metrics.observe_request("m", "/v1/admin/models/{model_id:path}/load", 200, 3.0)  # admin: left out
    metrics.observe_request("", "/v1/admin/models", 200, 0.001)  # polling, no model: left out
    metrics.count_tokens("m", input_tokens=100, output_tokens=40)
    clock.advance(2.0)
    point = history.sample()
    assert point is not None
    assert (point.t, point.interval_s) == (1_700_001_002.0, 2.0)
    assert (point.requests_per_s, point.errors_per_s) == (2.0, 0.5)
    assert (point.input_tokens_per_s, point.output_tokens_per_s) == (50.0, 20.0)
    # Buckets ≤0.025: 1, ≤0.05: 2, ≤0.25: 3, ≤1: 4. p50 (rank 2) is 0.05, the top of the
    # second bucket; p99 (rank 3.96) is 96% of the way through (0.5, 1].
    assert point.latency_p50_s == pytest.approx(0.05)
    assert point.latency_p99_s == pytest.approx(0.98)
    clock.advance(4.0)
    quiet = history.sample()
    assert quiet is not None and quiet.interval_s == 4.0
    assert (quiet.requests_per_s, quiet.output_tokens_per_s, quiet.latency_p50_s, quiet.latency_p99_s) == (
        0.0, 0.0, None, None,
    )  # fmt: skip


def test_the_ring_keeps_the_window_and_answers_since() -> None:
    clock = ManualClock()
    history = MetricsHistory(Metrics().registry, lambda: [], clock, interval_s=2.0, window_s=6.0)
    for _ in range(6):
        history.sample()
        clock.advance(2.0)
    times = [point.t for point in history.points()]
    assert times == [1_700_001_006.0, 1_700_001_008.0, 1_700_001_010.0]
    assert [point.t for point in history.points(since=1_700_001_006.0)] == times[1:]
    shown = history.as_json(since=1_700_001_008.0)
    assert (shown["interval_s"], shown["window_s"], len(shown["points"])) == (2.0, 6.0, 1)
    assert shown["points"][0]["requests_per_s"] == 0.0 and shown["points"][0]["latency_p50_s"] is None


def test_gauges_sum_the_models_and_count_memory_of_loaded_ones_only() -> None:
    base = fake_slot(FakeBackend()).status()

    def status(state: str, queued: int, in_flight: int, counted: int, measured: int) -> ModelStatus:
        memory = MemoryStatus(None, None, measured_bytes=measured, counted_bytes=counted, counted_gpu_bytes=0)
        return replace(base, state=state, queued=queued, in_flight=in_flight, memory=memory)

    statuses = [status("ready", 2, 1, 500, 450), status("loading", 0, 0, 300, 0), status("unloaded", 0, 0, 900, 0)]
    assert read_gauges(statuses) == Gauges(queued=2, in_flight=1, memory_counted_bytes=800,
                                           memory_measured_bytes=450, loaded_models=2)  # fmt: skip
    clock = ManualClock()
    history = MetricsHistory(Metrics().registry, lambda: statuses, clock)
    history.sample()
    clock.advance(2.0)
    point = history.sample()
    assert point is not None and (point.queued, point.in_flight, point.memory_counted_bytes) == (2, 1, 800)
