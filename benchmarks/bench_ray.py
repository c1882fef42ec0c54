"""modelpool on Ray Serve vs the single-process server, side by side on one machine (one run).

Targets, one after another (never two at once), all from the same config (`enabled_models`:
MiniLM and SmolLM2; Ray settings are ignored by the single-process server):

  (a) single: `modelpool serve` as a subprocess on 127.0.0.1;
  (b) ray ×1: a two-node `ray.cluster_utils.Cluster` on this machine (as tests/ray_serve/cluster.py),
      Serve's proxy on 127.0.0.1, `deploy()` with ONE replica per model (like for like);
  (c) ray ×2: the same cluster, redeployed with 2 replicas of each model, one per node
      (`max_replicas_per_node: 1`). Both "nodes" share this machine's cores, so (c) shows
      Ray's overhead, not scaling.

Load (aiohttp, as bench_embeddings), after a warm-up that excludes load time:
  * embeddings: `--clients` concurrent single-text requests × `--rounds` → requests/s (the
    median round); then `--sequential` requests one at a time → p50 latency;
  * chat: 4 concurrent non-streamed requests (`max_tokens` 32, `temperature` 0) × 5 rounds →
    requests/s (median round); 10 sequential → p50 latency.

Prints a table with ray/single ratios; also writes benchmarks/results/bench_ray.json.
Run: `.venv/bin/python -m benchmarks.bench_ray` (needs `make install-ray`; ~3–5 min on 2 cores).
"""

from __future__ import annotations

import os

# Before Ray is first imported: otherwise Ray swaps 127.0.0.1 for the host's external
# address and ray.init hangs (tests/ray_serve/cluster.py).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx
import yaml

from benchmarks.bench_llm_concurrency import machine
from benchmarks.bench_serving import free_port, running

EMBED = "all-minilm-l6-v2"
CHAT = "smollm2-135m-instruct"
MODELS = [EMBED, CHAT]
RESULTS = Path(__file__).resolve().parent / "results" / "bench_ray.json"
SENTENCES = [f"Request number {i} asks about topic {i % 5} in one plain sentence." for i in range(64)]
TOPICS = ["the sea", "a mountain", "a city at night", "a forest", "the desert", "a river", "the moon", "a storm"]
# As tests/ray_serve/cluster.py: custom resources make placement observable.
TIMEOUT = aiohttp.ClientTimeout(total=300)


@dataclass
class Target:
    name: str
    url: str
    ready_s: float
    embed_rps: float = 0.0
    embed_p50_ms: float = 0.0
    chat_rps: float = 0.0
    chat_p50_ms: float = 0.0
    chat_tokens: list[int] = field(default_factory=list)
    chat_texts: list[str] = field(default_factory=list)
    placement: dict[str, Any] = field(default_factory=dict)
    load_avg: tuple[float, float] = (0.0, 0.0)
    seconds: float = 0.0


def config(port: int, replicas: int) -> dict[str, Any]:
    """One config for all targets; only `num_replicas` differs between (b) and (c)."""
    ray_model = {
        "num_replicas": replicas,
        "max_replicas_per_node": 1,  # the same in (b) and (c), so (c) only adds a replica
        "ray_actor_options": {"num_cpus": 0.25, "resources": {"model_host": 0.01}},
    }
    return {
        "enabled_models": MODELS,
        "server": {"port": port, "model_wait_s": 120, "ui": False},
        "ray": {"ingress": {"ray_actor_options": {"num_cpus": 0.1}}},  # on the head: ray.ingress.on_head
        "models": {model: {"ray": dict(ray_model)} for model in MODELS},
    }


def chat_body(i: int, max_tokens: int) -> dict[str, Any]:
    content = f"Write a short story about {TOPICS[i % len(TOPICS)]}."
    return {"model": CHAT, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip


async def embed_one(session: aiohttp.ClientSession, text: str) -> None:
    async with session.post("/v1/embeddings", json={"model": EMBED, "input": text}) as response:
        if response.status != 200:
            raise RuntimeError(f"embeddings: {response.status} {await response.text()}")
        await response.read()


async def chat_one(session: aiohttp.ClientSession, i: int, max_tokens: int) -> tuple[int, str]:
    async with session.post("/v1/chat/completions", json=chat_body(i, max_tokens)) as response:
        if response.status != 200:
            raise RuntimeError(f"chat: {response.status} {await response.text()}")
        reply = await response.json()
    return int(reply["usage"]["completion_tokens"]), str(reply["choices"][0]["message"]["content"])


async def measure(target: Target, args: argparse.Namespace) -> None:
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(target.url, connector=connector, timeout=TIMEOUT) as session:
        # Warm-up: load time, first-call costs and the connection pool stay out of the numbers.
        for i in range(3):
            await embed_one(session, SENTENCES[i])
        await asyncio.gather(*(embed_one(session, s) for s in SENTENCES[: args.clients]))
        await chat_one(session, 0, args.max_tokens)
        await asyncio.gather(*(chat_one(session, i, args.max_tokens) for i in range(args.chat_clients)))

        rounds = []
        for r in range(args.rounds):
            texts = [SENTENCES[(r + i) % len(SENTENCES)] for i in range(args.clients)]
            started = time.perf_counter()
            await asyncio.gather(*(embed_one(session, t) for t in texts))
            rounds.append(time.perf_counter() - started)
        target.embed_rps = args.clients / statistics.median(rounds)
        latencies = []
        for i in range(args.sequential):
            started = time.perf_counter()
            await embed_one(session, SENTENCES[i % len(SENTENCES)])
            latencies.append(time.perf_counter() - started)
        target.embed_p50_ms = statistics.median(latencies) * 1000

        rounds = []
        for _ in range(args.chat_rounds):
            started = time.perf_counter()
            replies = await asyncio.gather(*(chat_one(session, i, args.max_tokens) for i in range(args.chat_clients)))
            rounds.append(time.perf_counter() - started)
            target.chat_tokens += [n for n, _ in replies]
        target.chat_rps = args.chat_clients / statistics.median(rounds)
        latencies = []
        for i in range(args.chat_sequential):
            started = time.perf_counter()
            tokens, text = await chat_one(session, i, args.max_tokens)
            latencies.append(time.perf_counter() - started)
            target.chat_tokens.append(tokens)
            target.chat_texts.append(text)
        target.chat_p50_ms = statistics.median(latencies) * 1000


def run_target(target: Target, args: argparse.Namespace) -> Target:
    print(f"  measuring {target.name} (ready after {target.ready_s:.1f} s) ...", file=sys.stderr, flush=True)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    asyncio.run(measure(target, args))
    target.seconds = time.monotonic() - started
    target.load_avg = (load_before, os.getloadavg()[0])
    print(f"  {target.name}: done in {target.seconds:.1f} s", file=sys.stderr, flush=True)
    return target


def placement(url: str) -> dict[str, Any]:
    """Replicas per node of each model, from the admin API (Ray mode reports node ids)."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
        listing = httpx.get(f"{url}/v1/admin/models", timeout=30).json()
        found = listing.get("data", listing.get("models", [])) if isinstance(listing, dict) else listing
        models = cast(list[dict[str, Any]], found)  # JSON: a list of model objects
        return {
            m["id"]: {"replicas": len(m.get("replicas") or []), "by_node": m.get("replicas_by_node")}
            for m in models
            if m.get("id") in MODELS
        }
    return {}


def single(config_file: Path, args: argparse.Namespace) -> Target:
    port = free_port()
    argv = [sys.executable, "-m", "modelpool", "serve", "--config", str(config_file), "--port", str(port),
            "--log-level", "warning"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running(argv, f"{url}/readyz", timeout_s=240) as ready_s:
        return run_target(Target("single", url, ready_s), args)


@contextlib.contextmanager
def ray_cluster() -> Iterator[tuple[Any, Any, int]]:
    """The two-node cluster of the Ray tests (tests/ray_serve/cluster.py) with Serve on a free port."""
    from tests.ray_serve.cluster import two_node_cluster

    port = free_port()
    with two_node_cluster(port) as (cluster, node_b):
        yield cluster, node_b, port


def omp_threads_in_replica() -> dict[str, Any]:
    """What a replica-sized Ray actor (num_cpus 0.25, as the model replicas) gets for
    OMP_NUM_THREADS and torch's intra-op threads (Ray sets OMP_NUM_THREADS from num_cpus
    when unset; the single-process server gets torch's default)."""
    import ray

    @ray.remote(num_cpus=0.25)
    class Probe:
        def threads(self) -> dict[str, Any]:
            import torch

            return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads()}

    probe = Probe.remote()  # type: ignore[attr-defined]
    try:
        return dict(ray.get(probe.threads.remote(), timeout=120))
    finally:
        ray.kill(probe)


def ray_targets(directory: Path, args: argparse.Namespace) -> tuple[list[Target], dict[str, Any]]:
    from modelpool.config.loader import load_config
    from modelpool.ray_serve.deploy import deploy

    targets: list[Target] = []
    notes: dict[str, Any] = {}
    started = time.monotonic()
    with ray_cluster() as (cluster, node_b, port):
        notes["cluster_start_s"] = round(time.monotonic() - started, 1)
        nodes = {str(cluster.head_node.node_id): "head", str(node_b.node_id): "node_b"}
        url = f"http://127.0.0.1:{port}"
        with contextlib.suppress(Exception):
            notes["replica_threads"] = omp_threads_in_replica()
        for replicas in [1, 2] if args.two_replicas else [1]:
            config_file = directory / f"ray-{replicas}.yaml"
            config_file.write_text(yaml.safe_dump(config(port, replicas)), encoding="utf-8")
            deploying = time.monotonic()
            print(f"  deploying {replicas} replica(s) per model ...", file=sys.stderr, flush=True)
            deploy(load_config(config_file), progress=lambda line: print(f"    {line}", file=sys.stderr, flush=True))
            target = Target(f"ray ×{replicas}", url, time.monotonic() - deploying)
            where = placement(url)
            for model in where.values():
                by_node = model.get("by_node") or {}
                model["by_node"] = {nodes.get(node, node): n for node, n in by_node.items()}
            target.placement = where
            targets.append(run_target(target, args))
    return targets, notes


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if theirs else "–"


def report(targets: list[Target], notes: dict[str, Any], args: argparse.Namespace, stamp: str) -> None:
    base = targets[0]
    print(f"## Ray Serve vs single process {stamp} — {machine()}, nproc {os.cpu_count()}")
    print()
    print(
        f"{EMBED}: {args.clients} concurrent 1-text requests × {args.rounds} rounds (req/s of the median round), "
        f"{args.sequential} sequential (p50). {CHAT}: {args.chat_clients} concurrent non-streamed chats, "
        f"max_tokens {args.max_tokens}, temperature 0, × {args.chat_rounds} rounds; {args.chat_sequential} "
        "sequential (p50). Ray: 2-node cluster_utils cluster on this machine, both nodes sharing its cores."
    )
    print()
    print("| target | embed req/s | embed p50 | chat req/s | chat p50 | ready after | load avg |")
    print("|---|---|---|---|---|---|---|")
    for t in targets:
        print(
            f"| {t.name} | {t.embed_rps:.1f} | {t.embed_p50_ms:.1f} ms | {t.chat_rps:.2f} | {t.chat_p50_ms:.0f} ms | "
            f"{t.ready_s:.1f} s | {t.load_avg[0]:.1f} → {t.load_avg[1]:.1f} |"
        )
    if len(targets) > 1:
        print()
        print("| ray/single | embed req/s | embed p50 | chat req/s | chat p50 |")
        print("|---|---|---|---|---|")
        for t in targets[1:]:
            print(
                f"| {t.name} | {ratio(t.embed_rps, base.embed_rps)}× | {ratio(t.embed_p50_ms, base.embed_p50_ms)}× | "
                f"{ratio(t.chat_rps, base.chat_rps)}× | {ratio(t.chat_p50_ms, base.chat_p50_ms)}× |"
            )
    print()
    lines = []
    for t in targets[1:]:
        same = t.chat_texts == base.chat_texts
        lines.append(f"{t.name}: greedy chat replies {'identical to' if same else 'DIFFER from'} single's")
        if t.placement:
            lines.append(f"{t.name} placement {json.dumps(t.placement)}")
    tokens = {t.name: round(statistics.mean(t.chat_tokens), 1) for t in targets if t.chat_tokens}
    lines.append(f"mean completion tokens per chat {json.dumps(tokens, ensure_ascii=False)}")
    if "cluster_start_s" in notes:
        lines.append(f"Ray cluster + Serve start {notes['cluster_start_s']} s")
    if "replica_threads" in notes:
        lines.append(f"a num_cpus=0.25 Ray actor gets {json.dumps(notes['replica_threads'])}")
    print("Notes: " + "; ".join(lines) + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32, help="concurrent embedding requests")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of --clients embedding requests")
    parser.add_argument("--sequential", type=int, default=40, help="sequential embedding requests (p50)")
    parser.add_argument("--chat-clients", type=int, default=4)
    parser.add_argument("--chat-rounds", type=int, default=5)
    parser.add_argument("--chat-sequential", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--no-two-replicas", dest="two_replicas", action="store_false",
                        help="skip (c), 2 replicas per model over the two nodes")  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"write the results there (default {RESULTS})")
    args = parser.parse_args()
    stamp = datetime.now().isoformat(timespec="minutes")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        directory = Path(tmp)
        config_file = directory / "single.yaml"
        config_file.write_text(yaml.safe_dump(config(free_port(), 1)), encoding="utf-8")
        targets = [single(config_file, args)]
        more, notes = ray_targets(directory, args)
        targets += more
    notes["total_s"] = round(time.monotonic() - started, 1)
    print(f"  total {notes['total_s']:.0f} s", file=sys.stderr)
    report(targets, notes, args, stamp)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    payload = {"date": stamp, "machine": machine(), "nproc": os.cpu_count(),
               "args": {k: str(v) for k, v in vars(args).items()}, "notes": notes,
               "targets": [asdict(t) for t in targets]}  # fmt: skip
    args.json.write_text(json.dumps(payload, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"  wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
