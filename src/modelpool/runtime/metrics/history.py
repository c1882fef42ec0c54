"""The last minutes of the pool's own metrics, for charts: every few seconds the sampler
reads the Prometheus registry (cumulative counters and the latency histogram) and the
models' statuses (queue, in flight, memory), and keeps one point per interval in a ring.

Rates and quantiles are per interval: the difference of two cumulative readings over the
seconds between them, so a chart shows what happened then, not an average since start.
Counted are model requests (they name a model, as inference routes do); the admin routes
and whatever polls the server (health checks, the workbench itself) are left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from modelpool.runtime.clock import Clock
from modelpool.status import ModelStatus

log = logging.getLogger("modelpool.runtime")

Buckets = tuple[tuple[float, float], ...]
"""(upper bound, cumulative count) pairs, ascending, the last one +inf (Prometheus' `le`)."""

_LOADED_STATES = frozenset({"loading", "ready", "unloading"})


@dataclass(frozen=True)
class Counters:
    """Cumulative totals at one moment, summed over models and routes."""

    requests: float = 0.0
    errors: float = 0.0
    latency: Buckets = ()
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    process_rss_bytes: float = 0.0
    """Not cumulative: the process's RSS at the reading (the memory gauges' collector)."""
    runtimes_bytes: float = 0.0
    """Not cumulative: the runtimes' first imports, counted once each."""


@dataclass(frozen=True)
class Gauges:
    """The pool's state at one moment, summed over models."""

    queued: int = 0
    in_flight: int = 0
    memory_counted_bytes: int = 0
    """What the budget counts for loaded models (measured once loaded, else estimated)."""
    memory_measured_bytes: int = 0
    loaded_models: int = 0


@dataclass(frozen=True)
class HistoryPoint:
    t: float
    """Wall-clock end of the interval (seconds since the epoch)."""
    interval_s: float
    requests_per_s: float
    errors_per_s: float
    """Requests answered with status 400 or above."""
    latency_p50_s: float | None
    """None when no request finished in the interval."""
    latency_p99_s: float | None
    input_tokens_per_s: float
    output_tokens_per_s: float
    queued: int
    in_flight: int
    memory_counted_bytes: int
    memory_measured_bytes: int
    loaded_models: int
    process_rss_bytes: int = 0
    """modelpool's RSS; the models' measured memory and the runtimes are parts of it."""
    runtimes_bytes: int = 0


def _is_model_request(labels: dict[str, str]) -> bool:
    return bool(labels.get("model")) and not labels.get("route", "").startswith("/v1/admin")


def read_counters(registry: CollectorRegistry) -> Counters:
    requests = errors = input_tokens = output_tokens = rss = runtimes = 0.0
    buckets: dict[float, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "modelpool_requests_total" and _is_model_request(labels):
                requests += value
                errors += value if int(labels.get("status", "0")) >= 400 else 0.0
            elif name == "modelpool_request_duration_seconds_bucket" and _is_model_request(labels):
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif name == "modelpool_input_tokens_total":
                input_tokens += value
            elif name == "modelpool_output_tokens_total":
                output_tokens += value
            elif name == "modelpool_process_resident_bytes":
                rss += value
            elif name == "modelpool_runtime_memory_bytes":
                runtimes += value
    return Counters(requests, errors, tuple(sorted(buckets.items())), input_tokens, output_tokens, rss, runtimes)


def read_gauges(statuses: Iterable[ModelStatus]) -> Gauges:
    queued = in_flight = counted = measured = loaded = 0
    for status in statuses:
        queued += status.queued
        in_flight += status.in_flight
        measured += status.memory.measured_bytes
        if status.state in _LOADED_STATES:
            counted += status.memory.counted_bytes
            loaded += 1
    return Gauges(queued, in_flight, counted, measured, loaded)


def bucket_delta(before: Buckets, after: Buckets) -> Buckets:
    """The histogram of what was observed between two readings (bounds that appeared in
    between, with a new label set, count from zero)."""
    earlier = dict(before)
    return tuple((bound, max(0.0, count - earlier.get(bound, 0.0))) for bound, count in after)


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, as Prometheus' `histogram_quantile`: linear
    inside the bucket that holds rank q·total, the first bucket starting at 0; a rank in the
    +inf bucket gives the highest finite bound. None for an empty histogram."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return lower


def point_between(before: Counters, after: Counters, seconds: float, gauges: Gauges, t: float) -> HistoryPoint:
    def rate(earlier: float, later: float) -> float:
        return max(0.0, later - earlier) / seconds if seconds > 0 else 0.0

    latency = bucket_delta(before.latency, after.latency)
    return HistoryPoint(
        t=round(t, 3),
        interval_s=round(seconds, 3),
        requests_per_s=rate(before.requests, after.requests),
        errors_per_s=rate(before.errors, after.errors),
        latency_p50_s=quantile(latency, 0.5),
        latency_p99_s=quantile(latency, 0.99),
        input_tokens_per_s=rate(before.input_tokens, after.input_tokens),
        output_tokens_per_s=rate(before.output_tokens, after.output_tokens),
        **asdict(gauges),
        process_rss_bytes=int(after.process_rss_bytes),
        runtimes_bytes=int(after.runtimes_bytes),
    )


class MetricsHistory:
    """A ring of the last `window_s` seconds of points, one per `interval_s`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        statuses: Callable[[], list[ModelStatus]],
        clock: Clock,
        *,
        interval_s: float = 2.0,
        window_s: float = 900.0,
    ) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self._registry = registry
        self._statuses = statuses
        self._clock = clock
        self._points: deque[HistoryPoint] = deque(maxlen=max(1, round(window_s / interval_s)))
        self._last: tuple[float, Counters] | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> HistoryPoint | None:
        """Read the metrics now; the first reading only sets the baseline (no point)."""
        now, counters = self._clock.monotonic(), read_counters(self._registry)
        last, self._last = self._last, (now, counters)
        if last is None:
            return None
        point = point_between(last[1], counters, now - last[0], read_gauges(self._statuses()), self._clock.time())
        self._points.append(point)
        return point

    def points(self, since: float | None = None) -> list[HistoryPoint]:
        """The kept points, oldest first; with `since`, only those after that wall-clock time."""
        return [p for p in self._points if since is None or p.t > since]

    def as_json(self, since: float | None = None) -> dict[str, Any]:
        points = [asdict(point) for point in self.points(since)]
        return {"interval_s": self.interval_s, "window_s": self.window_s, "points": points}

    def start(self) -> None:
        """Sample every `interval_s` until stop() (call from inside the event loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._sample_forever(), name="metrics-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sample_forever(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a chart gap, not a dead sampler
                log.exception("metrics sampling failed")
            await asyncio.sleep(self.interval_s)
