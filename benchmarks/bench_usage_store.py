"""What durable usage costs a request on the event loop (issue 33, item 4).

Side by side in one run, interleaved A B B A so a noisy machine's drift hits all alike:

  * memory: `UsageLedger.record` as before (`usage_store` off);
  * durable: the same with the SQLite store's journal (a dict update; the write happens
    at the next flush, on a worker thread) — what modelpool does;
  * per-request commit: what it avoids, an INSERT and a COMMIT (WAL, synchronous=NORMAL)
    on the loop for every request.

Also the time one flush of a second's worth of requests takes on its worker thread.
Prints µs per request for each and the ratios to `memory`.

Run: `PYTHONPATH=src .venv/bin/python -m benchmarks.bench_usage_store` (a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from modelpool.inference import RequestUsage
from modelpool.pool_api.usage import Limits
from modelpool.runtime.metrics.prometheus import Metrics
from modelpool.runtime.ratelimit.durable import UsageStore
from modelpool.runtime.ratelimit.limiter import RateLimiter
from modelpool.runtime.ratelimit.usage import UsageLedger

KEYS = [f"key{i}" for i in range(8)]
MODELS = ["chat", "embed"]


def timed(record: Callable[[int], None], n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        record(i)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    usage = RequestUsage(input_tokens=20, output_tokens=30)
    with tempfile.TemporaryDirectory() as folder:
        plain = UsageLedger(Metrics())
        durable_ledger = UsageLedger(Metrics())
        limiter = RateLimiter({key: Limits(600, 100_000) for key in KEYS}, Limits())
        store = UsageStore(Path(folder) / "usage.sqlite", durable_ledger, limiter, 1.0)
        store.restore()
        naive = sqlite3.connect(Path(folder) / "naive.sqlite", isolation_level=None)
        naive.execute("PRAGMA journal_mode=WAL")
        naive.execute("PRAGMA synchronous=NORMAL")
        naive.execute("CREATE TABLE u (account TEXT, model TEXT, tokens INTEGER)")

        def per_commit(i: int) -> None:
            naive.execute("BEGIN")
            naive.execute("INSERT INTO u VALUES (?,?,?)", (KEYS[i % 8], MODELS[i % 2], 50))
            naive.execute("COMMIT")

        ways: dict[str, Callable[[int], None]] = {
            "memory": lambda i: plain.record(KEYS[i % 8], usage, MODELS[i % 2]),
            "durable": lambda i: durable_ledger.record(KEYS[i % 8], usage, MODELS[i % 2]),
            "per-request commit": per_commit,
        }
        results: dict[str, list[float]] = {name: [] for name in ways}
        flushes = []
        order = list(ways)
        for round_ in range(args.rounds):
            for name in order if round_ % 2 == 0 else order[::-1]:  # A B C, C B A, ...
                results[name].append(timed(ways[name], args.requests))
            started = time.perf_counter()
            asyncio.run(store.flush())
            flushes.append((time.perf_counter() - started) * 1000)
        asyncio.run(store.close())
    base = statistics.median(results["memory"])
    print(f"load average {os.getloadavg()[0]:.2f}; {args.requests} requests x {args.rounds} rounds")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:>20}: {median:8.2f} µs/request on the loop ({median / base:.2f}x memory)")
    print(f"{'flush':>20}: {statistics.median(flushes):8.2f} ms for {args.requests} requests' rows (worker thread)")


if __name__ == "__main__":
    main()
