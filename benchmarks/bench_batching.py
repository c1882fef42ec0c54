"""Continuous batching in the transformers backend (run: make bench).

Side by side in one run, same model and prompts: aggregate output tokens/s of N
concurrent streams (N = 1, 8, 32) against the same N requests served one at a time,
plus time to first token (p50/p99) under that load. Streams go through the HTTP API.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from datetime import date

from benchmarks.bench_serving import free_port, running, serve_argv

MODEL = "smollm2-135m-instruct-hf"
MAX_TOKENS = 64
TOPICS = ["the sea", "a mountain", "a city at night", "a forest", "the desert", "a river", "the moon", "a storm"]


def prompt(i: int) -> str:
    return f"Write a short story number {i} about {TOPICS[i % len(TOPICS)]}."


async def one_stream(session, i: int) -> tuple[int, float]:
    """(output tokens, seconds to the first token) of one streamed request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(i)}],
        "max_tokens": MAX_TOKENS,
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


async def measure(url: str, streams: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=900)) as session:
        await one_stream(session, 0)  # warm up
        started = time.perf_counter()
        together = await asyncio.gather(*(one_stream(session, i) for i in range(streams)))
        concurrent_s = time.perf_counter() - started
        started = time.perf_counter()
        alone = [await one_stream(session, i) for i in range(streams)]
        sequential_s = time.perf_counter() - started
    firsts = sorted(t for _, t in together)
    return {
        "concurrent": sum(n for n, _ in together) / concurrent_s,
        "sequential": sum(n for n, _ in alone) / sequential_s,
        "ttft_p50": statistics.median(firsts),
        "ttft_p99": firsts[min(len(firsts) - 1, round(0.99 * (len(firsts) - 1)))],
    }


def main() -> None:
    port = free_port()
    argv = serve_argv(port, MODEL)
    env_config = {"MODELPOOL_MODELS__SMOLLM2-135M-INSTRUCT-HF__PRELOAD": "true"}
    os.environ.update(env_config)
    with running(argv, f"http://127.0.0.1:{port}/readyz", timeout_s=300):
        results = {n: asyncio.run(measure(f"http://127.0.0.1:{port}", n)) for n in (1, 8, 32)}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Continuous batching benchmark {date.today()} — {machine}")
    print()
    print(f"`{MODEL}` (float32, transformers), greedy, {MAX_TOKENS} tokens a request, streamed over HTTP.")
    print()
    print("| streams | tokens/s concurrent | tokens/s one at a time | ratio | TTFT p50 | TTFT p99 |")
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        print(
            f"| {n} | {r['concurrent']:.1f} | {r['sequential']:.1f} | {r['concurrent'] / r['sequential']:.2f} | "
            f"{r['ttft_p50'] * 1000:.0f} ms | {r['ttft_p99'] * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
