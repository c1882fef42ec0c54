"""Continuous batching in the transformers backend (run: make bench).

Side by side in one run, same server, model and prompts, streamed over HTTP:

  * burst (default): N streams (32) sent at once, 128 greedy tokens each: time to first
    token (p50/p99) and aggregate output tokens/s, with the waiting prompts prefilled
    together (the default) and one at a time (`prefill_rows: 1`, the engine before batched
    prefill); the model is reloaded with each setting in turn, alternating for `--rounds`.
  * `--table`: aggregate tokens/s of N concurrent streams (N = 1, 8, 32) against the same
    N requests served one at a time, with their TTFT under that load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from datetime import date
from typing import Any

from benchmarks.bench_serving import free_port, running, serve_argv

MODEL = "smollm2-135m-instruct-hf"
TOPICS = ["the sea", "a mountain", "a city at night", "a forest", "the desert", "a river", "the moon", "a storm"]
# Load-time overrides add up, so each setting is named in full (32: the default).
PREFILL_MODES: dict[str, dict[str, Any]] = {"one at a time": {"prefill_rows": 1}, "together": {"prefill_rows": 32}}


def prompt(i: int) -> str:
    return f"Write a short story number {i} about {TOPICS[i % len(TOPICS)]}."


async def one_stream(session: Any, i: int, max_tokens: int) -> tuple[int, float]:
    """(output tokens, seconds to the first token) of one streamed request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(i)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, tokens = time.perf_counter(), None, 0
    async with session.post("/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            if first is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return tokens, first if first is not None else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def burst(session: Any, streams: int, max_tokens: int) -> dict[str, float]:
    """`streams` requests sent at once: their aggregate tokens/s and TTFT."""
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(session, i, max_tokens) for i in range(streams)))
    elapsed = time.perf_counter() - started
    firsts = [t for _, t in results]
    return {
        "tokens_per_s": sum(n for n, _ in results) / elapsed,
        "ttft_p50": statistics.median(firsts),
        "ttft_p99": percentile(firsts, 0.99),
    }


async def measure_table(url: str, streams: int, max_tokens: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=900)) as session:
        await one_stream(session, 0, max_tokens)  # warm up
        together = await burst(session, streams, max_tokens)
        started = time.perf_counter()
        alone = [await one_stream(session, i, max_tokens) for i in range(streams)]
        sequential = sum(n for n, _ in alone) / (time.perf_counter() - started)
    return {**together, "sequential": sequential}


async def measure_burst(url: str, overrides: dict[str, Any], streams: int, max_tokens: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=900)) as session:
        async with session.post(f"/v1/admin/models/{MODEL}/load", json={"overrides": overrides}) as loaded:
            loaded.raise_for_status()
        await one_stream(session, 0, max_tokens)  # warm up
        return await burst(session, streams, max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=32, help="requests in the burst")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1, help="bursts per prefill setting (medians reported)")
    parser.add_argument("--table", action="store_true", help="concurrent vs one at a time, 1/8/32 streams")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    os.environ["MODELPOOL_MODELS__SMOLLM2-135M-INSTRUCT-HF__PRELOAD"] = "true"
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    with running(serve_argv(port, MODEL), f"{url}/readyz", timeout_s=300):
        if args.table:
            table = {n: asyncio.run(measure_table(url, n, args.max_tokens)) for n in (1, 8, 32)}
        else:
            runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in PREFILL_MODES}
            for _ in range(args.rounds):
                for mode, overrides in PREFILL_MODES.items():
                    runs[mode].append(asyncio.run(measure_burst(url, overrides, args.streams, args.max_tokens)))
    print(f"## Continuous batching benchmark {date.today()} — {machine}")
    print()
    print(f"`{MODEL}` (float32, transformers), greedy, {args.max_tokens} tokens a request, streamed over HTTP.")
    print()
    if args.table:
        print_table(table)
    else:
        print_burst(runs, args.streams)


def print_burst(runs: dict[str, list[dict[str, float]]], streams: int) -> None:
    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    print(f"A burst of {streams} streams sent at once; waiting prompts prefilled one at a time vs together:")
    print()
    print("| prefill | TTFT p50 | TTFT p99 | aggregate tokens/s |")
    print("|---|---|---|---|")
    for mode in runs:
        print(
            f"| {mode} | {median(mode, 'ttft_p50') * 1000:.0f} ms | {median(mode, 'ttft_p99') * 1000:.0f} ms | "
            f"{median(mode, 'tokens_per_s'):.1f} |"
        )
    before, after = "one at a time", "together"
    print(
        f"| ratio (together / one at a time) | {median(after, 'ttft_p50') / median(before, 'ttft_p50'):.2f} | "
        f"{median(after, 'ttft_p99') / median(before, 'ttft_p99'):.2f} | "
        f"{median(after, 'tokens_per_s') / median(before, 'tokens_per_s'):.2f} |"
    )


def print_table(results: dict[int, dict[str, float]]) -> None:
    print("| streams | tokens/s concurrent | tokens/s one at a time | ratio | TTFT p50 | TTFT p99 |")
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        print(
            f"| {n} | {r['tokens_per_s']:.1f} | {r['sequential']:.1f} | {r['tokens_per_s'] / r['sequential']:.2f} | "
            f"{r['ttft_p50'] * 1000:.0f} ms | {r['ttft_p99'] * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
