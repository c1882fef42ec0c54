"""What the load generator itself costs: client CPU per request of modelpool.loadgen (httpx,
a connection per in-flight slot) against httpx with one shared pool and aiohttp, sending the
same 32 concurrent one-sentence embedding requests to one `modelpool serve` (MiniLM).

CPU time of this process (time.process_time), not wall time, so other work on the machine
moves it little; the three clients run in ABBA-style rotation (`--rounds` times each).

Run: `.venv/bin/python -m benchmarks.bench_loadgen_client` (~1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import httpx

from benchmarks.bench_serving import free_port, running, serve_argv
from modelpool.loadgen import LoadSpec, open_client, run_batch

MODEL = "all-minilm-l6-v2"
SENTENCES = [f"Request number {i} asks about topic {i % 5} in one plain sentence." for i in range(32)]
BATCHES = 5  # rounds of 32 requests measured per sample
Sample = Callable[[str], Coroutine[Any, Any, float]]


def body(text: str) -> dict[str, str]:
    return {"model": MODEL, "input": text, "encoding_format": "base64"}


async def cpu_per_request(send_round: Callable[[], Awaitable[None]]) -> float:
    await send_round()  # connections opened, model warm
    began = time.process_time()
    for _ in range(BATCHES):
        await send_round()
    return (time.process_time() - began) / (BATCHES * len(SENTENCES))


async def loadgen(url: str) -> float:
    spec = LoadSpec(url, MODEL, kind="embeddings", extra_body={"encoding_format": "base64"})
    async with open_client(spec, len(SENTENCES)) as clients:

        async def send_round() -> None:
            records = await run_batch(clients, spec, SENTENCES, len(SENTENCES))
            assert all(r.ok for r in records), [r.error for r in records]

        return await cpu_per_request(send_round)


async def httpx_shared_pool(url: str) -> float:
    limits = httpx.Limits(max_connections=len(SENTENCES), keepalive_expiry=2)
    async with httpx.AsyncClient(base_url=url, limits=limits, trust_env=False) as client:

        async def one(text: str) -> None:
            (await client.post("/v1/embeddings", json=body(text))).raise_for_status()

        async def send_round() -> None:
            await asyncio.gather(*(one(s) for s in SENTENCES))

        return await cpu_per_request(send_round)


async def aiohttp_session(url: str) -> float:
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=64)) as session:

        async def one(text: str) -> None:
            async with session.post("/v1/embeddings", json=body(text)) as response:
                response.raise_for_status()
                await response.read()

        async def send_round() -> None:
            await asyncio.gather(*(one(s) for s in SENTENCES))

        return await cpu_per_request(send_round)


CLIENTS: dict[str, Sample] = {
    "modelpool.loadgen (httpx, a connection per slot)": loadgen,
    "httpx, one pool of 32": httpx_shared_pool,
    "aiohttp": aiohttp_session,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="samples per client (their order alternates)")
    args = parser.parse_args()
    port = free_port()
    samples: dict[str, list[float]] = {name: [] for name in CLIENTS}
    with running(serve_argv(port, MODEL), f"http://127.0.0.1:{port}/readyz"):
        url = f"http://127.0.0.1:{port}"
        names = list(CLIENTS)
        for i in range(args.rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                samples[name].append(asyncio.run(CLIENTS[name](url)))
    load = os.getloadavg()[0]
    print(f"Client CPU per request, 32 concurrent embeddings, median of {args.rounds} (load avg {load:.1f}):")
    print()
    print("| client | CPU ms / request |")
    print("|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values) * 1000:.2f} |")


if __name__ == "__main__":
    main()
